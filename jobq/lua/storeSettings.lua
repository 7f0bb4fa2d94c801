#!lua
--[[
  Store a Queue's settings: on its first use, and again after the server
  lost its data (an add found the mark of stored settings, meta field cfg,
  missing: see add.lua). A mode stored by another Queue is kept; a
  max_events or result TTL given is written. Nothing is written for the
  name of a sharded queue (a plain Queue opened on it is refused).

  KEYS[1]  queue base prefix
  ARGV[1]  event mode ('' not given)
  ARGV[2]  max_events ('' not given)
  ARGV[3]  result TTL in ms ('' not given)
  ARGV[4]  what more to write: 'c' the mark of stored settings, 's' the
           shard mark (a shard of a sharded queue: its scripts publish
           wake-ups), in any combination ('' neither)
  ARGV[5]  the number of the caller's database: stored in pub/sub mode
           (field db; the scripts cannot tell it). Every pub/sub event
           carries it: a channel's name has no database in it, so the queues
           of one name in several databases of a server share their
           channel, and readers drop the events of another database
  Returns  {event mode, max_events, result TTL in ms, shard count}, as
           stored (false for each not stored)
  Events   none; storing pub/sub mode adds the entry that tells the
           stream's readers (jobq/_reader.py _MODE_STORED); the stream goes
           a minute later (pub/sub mode keeps none)
]]
local FIELDS = { 'em', 'maxev', 'rttl', 'shards' }
local stored = redis.call('HMGET', K_META, unpack(FIELDS))
if stored[4] then return stored end
local writes = ARGV[4]
if ARGV[1] ~= '' and redis.call('HSETNX', K_META, 'em', ARGV[1]) == 1
    and ARGV[1] == 'pubsub' then
  redis.call('XADD', K_EVENTS, '*', 'ev', '__jobq_mode__')
  redis.call('PEXPIRE', K_EVENTS, 60000)
end
if ARGV[2] ~= '' then redis.call('HSET', K_META, 'maxev', ARGV[2]) end
if ARGV[3] ~= '' then redis.call('HSET', K_META, 'rttl', ARGV[3]) end
if redis.call('HGET', K_META, 'em') == 'pubsub' then
  redis.call('HSET', K_META, 'db', ARGV[5])
end
if string.find(writes, 'c', 1, true) then redis.call('HSET', K_META, 'cfg', '1') end
if string.find(writes, 's', 1, true) then redis.call('HSET', K_META, 'shard', '1') end
return redis.call('HMGET', K_META, unpack(FIELDS))
