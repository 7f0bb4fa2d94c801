#!lua
--[[
  Store a Queue's settings again, with the mark of stored settings (meta
  field cfg, which add.lua reports missing): after the queue's first add,
  or after the server lost its data. A mode stored by another Queue since
  is kept; a max_events or result TTL given is written.

  KEYS[1]  queue base prefix
  ARGV[1]  event mode ('' not given)
  ARGV[2]  max_events ('' not given)
  ARGV[3]  result TTL in ms ('' not given)
  Returns  1
  Events   none; storing pub/sub mode adds the entry that tells the
           stream's readers (as jobq/_reader.py tell_readers_pubsub)
]]
if ARGV[1] ~= '' and redis.call('HSETNX', K_META, 'em', ARGV[1]) == 1
    and ARGV[1] == 'pubsub' then
  redis.call('XADD', K_EVENTS, '*', 'ev', '__jobq_mode__')
  redis.call('PEXPIRE', K_EVENTS, 60000)
end
if ARGV[2] ~= '' then redis.call('HSET', K_META, 'maxev', ARGV[2]) end
if ARGV[3] ~= '' then redis.call('HSET', K_META, 'rttl', ARGV[3]) end
redis.call('HSET', K_META, 'cfg', '1')
return 1
