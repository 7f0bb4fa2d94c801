#!lua flags=allow-oom
--[[
  Announce a live worker in the queue's registry, or remove it.

  KEYS[1]  queue base prefix
  ARGV[1]  worker name
  ARGV[2]  time to live of the announcement, ms; 0 removes the worker
  ARGV[3]  the announcing Worker object's token (two workers given one
           name are two tokens)
  ARGV[4…] field, value pairs describing the worker (host, pid, …)
  Returns  {the server time, ms; 1 when the announcement held another
           token (another worker of this name beat since, or went away
           without removing it), else 0}
  Writes   the hash worker:<name> (fields, 'inst' the token, 'hb' = now,
           'started' at the first beat) expiring after the TTL, and its
           name in the sorted set 'workers' scored by when it expires;
           names whose time is up are dropped from the set. A removal
           removes only an announcement of its own token
  Events   none
]]
local now = now_ms()
local name, ttl, inst = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local wk = base .. 'worker:' .. name
local K_WORKERS = base .. 'workers'
local held = redis.call('HGET', wk, 'inst')
if ttl <= 0 then
  if not held or held == inst then  -- not another worker's of this name
    redis.call('DEL', wk)
    redis.call('ZREM', K_WORKERS, name)
  end
  return { now, 0 }
end
if #ARGV > 3 then redis.call('HSET', wk, unpack(ARGV, 4)) end
redis.call('HSET', wk, 'hb', now, 'inst', inst)
redis.call('HSETNX', wk, 'started', now)
redis.call('PEXPIRE', wk, ttl)
redis.call('ZADD', K_WORKERS, now + ttl, name)
redis.call('ZREMRANGEBYSCORE', K_WORKERS, '-inf', now)
return { now, (held and held ~= inst) and 1 or 0 }
