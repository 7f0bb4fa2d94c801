#!lua
--[[
  Promote due delayed jobs, then take the next job for a worker.

  KEYS[1]  queue base prefix
  ARGV[1]  lock token
  ARGV[2]  lock duration, ms
  ARGV[3]  worker name
  ARGV[4]  rate limit: max jobs per window (0: no limit)
  ARGV[5]  rate limit window, ms
  Returns  {1, id, {job hash field, value, ...}}  a job was taken
           {0, ms}   nothing to take; ms until the next delayed job, or -1
           {2, ms}   rate limited for ms more
  Events   waiting (prev delayed) per promoted job; active; drained when the
           take leaves nothing waiting
]]
local now = now_ms()

local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, 1000)
for _, id in ipairs(due) do
  redis.call('ZREM', K_DELAYED, id)
  local f = redis.call('HMGET', job_key(id), 'priority', 'lifo')
  if f[1] then
    push_ready(id, tonumber(f[1]), f[2] == '1')
    redis.call('HSET', job_key(id), 'state', 'waiting')
    emit('waiting', id, { 'prev', 'delayed' })
  end
end

local function next_delay()
  local nxt = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
  if nxt[2] then return math.max(0, math.ceil(tonumber(nxt[2]) - now)) end
  return -1
end

if redis.call('HGET', K_META, 'paused') == '1' then return { 0, -1 } end

local limit_max = tonumber(ARGV[4])
local K_LIMITER = base .. 'limiter'
if limit_max > 0 then
  local used = tonumber(redis.call('GET', K_LIMITER) or '0')
  if used >= limit_max then
    local ttl = redis.call('PTTL', K_LIMITER)
    if ttl > 0 then return { 2, ttl } end
    redis.call('DEL', K_LIMITER)
  end
end

local id
for _ = 1, 100 do
  id = redis.call('RPOP', K_WAIT)
  if not id then
    local p = redis.call('ZPOPMIN', K_PRIO)
    id = p[1]
  end
  if not id or redis.call('EXISTS', job_key(id)) == 1 then break end
end
if not id then return { 0, next_delay() } end

if limit_max > 0 and redis.call('INCR', K_LIMITER) == 1 then
  redis.call('PEXPIRE', K_LIMITER, ARGV[5])
end

local jk = job_key(id)
redis.call('ZADD', K_ACTIVE, now, id)
redis.call('SET', lock_key(id), ARGV[1], 'PX', ARGV[2])
redis.call('HSET', jk, 'state', 'active', 'pon', now, 'pb', ARGV[3], 'tok', ARGV[1])
local atm = tonumber(redis.call('HGET', jk, 'atm') or '0')
emit('active', id, { 'attempt', atm + 1, 'worker', ARGV[3], 'prev', 'waiting' })
if redis.call('LLEN', K_WAIT) == 0 and redis.call('ZCARD', K_PRIO) == 0 then
  emit('drained', false, {})
else
  redis.call('ZADD', K_MARKER, 0, '0')
end
return { 1, id, redis.call('HGETALL', jk) }
