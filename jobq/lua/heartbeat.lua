#!lua
--[[
  Announce a live worker in the queue's registry, or remove it.

  KEYS[1]  queue base prefix
  ARGV[1]  worker name
  ARGV[2]  time to live of the announcement, ms; 0 removes the worker
  ARGV[3…] field, value pairs describing the worker (host, pid, …)
  Returns  the server time, ms
  Writes   the hash worker:<name> (fields, 'hb' = now, 'started' at the first
           beat) expiring after the TTL, and its name in the sorted set
           'workers' scored by when it expires; names whose time is up are
           dropped from the set
  Events   none
]]
local now = now_ms()
local name, ttl = ARGV[1], tonumber(ARGV[2])
local wk = base .. 'worker:' .. name
local K_WORKERS = base .. 'workers'
if ttl <= 0 then
  redis.call('DEL', wk)
  redis.call('ZREM', K_WORKERS, name)
  return now
end
if #ARGV > 2 then redis.call('HSET', wk, unpack(ARGV, 3)) end
redis.call('HSET', wk, 'hb', now)
redis.call('HSETNX', wk, 'started', now)
redis.call('PEXPIRE', wk, ttl)
redis.call('ZADD', K_WORKERS, now + ttl, name)
redis.call('ZREMRANGEBYSCORE', K_WORKERS, '-inf', now)
return now
