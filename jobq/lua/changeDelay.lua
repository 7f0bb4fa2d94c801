#!lua
--[[
  Reschedule a delayed job to run `delay` ms from now.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  delay, ms
  Returns  1; -1 no such job; -3 not delayed
  Events   delayed
]]
local id, delay = ARGV[1], tonumber(ARGV[2])
local jk = job_key(id)
local state = redis.call('HGET', jk, 'state')
if not state then return -1 end
if state ~= 'delayed' then return -3 end
local run_at = now_ms() + delay
redis.call('ZADD', K_DELAYED, run_at, id)
redis.call('HSET', jk, 'delay', delay, 'rdy', run_at)
mark_due(run_at)
emit('delayed', id, { 'delay', delay, 'run_at', run_at, 'prev', 'delayed' })
return 1
