#!lua
--[[
  Make delayed jobs wait now; their stored delay becomes 0 (as in BullMQ).

  KEYS[1]  queue base prefix
  ARGV[1]  job id; '' for the delayed jobs due soonest
  ARGV[2]  with no id: how many of them at most
  Returns  with an id: 1; -1 no such job; -3 not delayed.
           With none: {how many jobs were promoted, how many ids it took
           from the delayed set} (an id whose record is gone is dropped)
  Events   waiting (prev delayed), per job
]]
local function promote(id, f)
  redis.call('ZREM', K_DELAYED, id)
  push_ready(id, tonumber(f[2]) or 0, f[3] == '1')
  redis.call('HSET', job_key(id), 'state', 'waiting', 'rdy', now_ms())
  redis.call('HDEL', job_key(id), 'delay')  -- a missing delay reads as 0
  emit('waiting', id, { 'prev', 'delayed' })
end

local id = ARGV[1]
if id ~= '' then
  local f = redis.call('HMGET', job_key(id), 'state', 'priority', 'lifo')
  if not f[1] then return -1 end
  if f[1] ~= 'delayed' then return -3 end
  promote(id, f)
  return 1
end
local moved = 0
local due_ids = redis.call('ZRANGE', K_DELAYED, 0, tonumber(ARGV[2]) - 1)
for _, due in ipairs(due_ids) do
  local f = redis.call('HMGET', job_key(due), 'state', 'priority', 'lifo')
  if f[1] then  -- as promote_due does
    promote(due, f)
    moved = moved + 1
  else
    redis.call('ZREM', K_DELAYED, due)  -- its record gone: nothing to run
  end
end
return { moved, #due_ids }
