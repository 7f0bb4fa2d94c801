#!lua flags=allow-oom
--[[
  Store a sharded queue's shard count with its name, unless one is stored:
  on the ShardedQueue's first use, and again after the server lost its
  data.

  KEYS[1]  base prefix of the sharded queue's name
  ARGV[1]  the shard count
  ARGV[2]  'look': store nothing, only say whether a count is stored
  Returns  {the count stored (this one, or one stored before), 0}; {0, 0}
           when none was and the name is a plain queue that holds jobs or
           schedulers (nothing written: no worker of the sharded queue
           would look at them); to a look, {0, 1} when none is stored and
           one may be. Before it stores one (a sharded queue's first use, or
           the first since the server lost its data), the caller checks
           that no shard's name is a plain queue's (storeSettings.lua, 'f').
           Storing one clears the mark of an obliterate (field obliterated)
]]
local stored = redis.call('HGET', K_META, 'shards')
if stored then return { stored, 0 } end
if holds_jobs() then return { 0, 0 } end
if ARGV[2] == 'look' then return { 0, 1 } end
redis.call('HSET', K_META, 'shards', ARGV[1])
redis.call('HDEL', K_META, 'obliterated')  -- made again (see ShardedQueue.obliterate)
return { ARGV[1], 0 }
