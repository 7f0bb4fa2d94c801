#!lua
--[[
  Make a delayed job wait now; its stored delay becomes 0 (as in BullMQ).

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  Returns  1; -1 no such job; -3 not delayed
  Events   waiting (prev delayed)
]]
local id = ARGV[1]
local jk = job_key(id)
local f = redis.call('HMGET', jk, 'state', 'priority', 'lifo')
if not f[1] then return -1 end
if f[1] ~= 'delayed' then return -3 end
redis.call('ZREM', K_DELAYED, id)
push_ready(id, tonumber(f[2]) or 0, f[3] == '1')
redis.call('HSET', jk, 'state', 'waiting', 'rdy', now_ms())
redis.call('HDEL', jk, 'delay')  -- a missing delay reads as 0
emit('waiting', id, { 'prev', 'delayed' })
return 1
