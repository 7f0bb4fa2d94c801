#!lua
--[[
  Change a job's priority; a waiting job moves to its new place in line.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  priority (0: none)
  ARGV[3]  lifo ('1' | '0')
  Returns  1; -1 no such job
  Events   none
]]
local id, priority, lifo = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local jk = job_key(id)
local state = redis.call('HGET', jk, 'state')
if not state then return -1 end
redis.call('HSET', jk, 'priority', priority, 'lifo', lifo)
if state == 'waiting' then
  local removed = redis.call('LREM', K_WAIT, '0', id) + redis.call('ZREM', K_PRIO, id)
  if removed > 0 then push_ready(id, priority, lifo == '1') end
end
return 1
