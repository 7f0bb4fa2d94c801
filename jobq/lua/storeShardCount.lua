#!lua flags=allow-oom
--[[
  Store a sharded queue's shard count with its name, unless one is stored:
  on the ShardedQueue's first use, and again after the server lost its
  data.

  KEYS[1]  base prefix of the sharded queue's name
  ARGV[1]  the shard count
  Returns  the count stored (this one, or one stored before); 0 when none
           was and the name is a plain queue that holds jobs or schedulers
           (nothing written: no worker of the sharded queue would look at
           them)
]]
local stored = redis.call('HGET', K_META, 'shards')
if stored then return stored end
for _, key in ipairs({ K_WAIT, K_PRIO, K_DELAYED, K_ACTIVE, K_COMPLETED, K_FAILED,
    base .. 'waiting-children', base .. 'schedulers' }) do
  if redis.call('EXISTS', key) == 1 then return 0 end
end
redis.call('HSET', K_META, 'shards', ARGV[1])
return ARGV[1]
