#!lua flags=no-writes
--[[
  List the live workers of the queue: those whose heartbeat has not expired.

  KEYS[1]  queue base prefix
  Returns  {now ms, {name, {field, value, …}}, …}
]]
local now = now_ms()
local out = { now }
for _, name in ipairs(redis.call('ZRANGEBYSCORE', base .. 'workers', now, '+inf')) do
  local fields = redis.call('HGETALL', base .. 'worker:' .. name)
  if #fields > 0 then out[#out + 1] = { name, fields } end
end
return out
