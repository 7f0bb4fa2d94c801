#!lua
--[[
  Remove one job, whatever its state, unless it is active and locked.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  Returns  1 removed; 0 no such job; -2 active with its lock held
  Events   removed (prev: the state it was in)
]]
local id = ARGV[1]
local state = redis.call('HGET', job_key(id), 'state')
if not state then return 0 end
if state == 'active' and redis.call('EXISTS', lock_key(id)) == 1 then return -2 end
if state == 'waiting' then
  redis.call('LREM', K_WAIT, 0, id)
  redis.call('ZREM', K_PRIO, id)
elseif state == 'delayed' then
  redis.call('ZREM', K_DELAYED, id)
elseif state == 'active' then
  redis.call('ZREM', K_ACTIVE, id)
elseif state == 'completed' then
  redis.call('ZREM', K_COMPLETED, id)
elseif state == 'failed' then
  redis.call('ZREM', K_FAILED, id)
end
delete_job(id)
emit('removed', id, { 'prev', state })
return 1
