#!lua
--[[
  Pause or resume the whole queue (durable; workers stop taking jobs).

  KEYS[1]  queue base prefix
  ARGV[1]  '1' pause | '0' resume
  Returns  1
  Events   paused | resumed
]]
if ARGV[1] == '1' then
  redis.call('HSET', K_META, 'paused', '1')
  emit('paused', false, {})
else
  redis.call('HDEL', K_META, 'paused')
  redis.call('ZADD', K_MARKER, '0', '0')
  emit('resumed', false, {})
end
return 1
