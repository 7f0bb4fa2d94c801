#!lua
--[[
  Recover active jobs whose lock expired (their worker died or hung).

  KEYS[1]  queue base prefix
  ARGV[1]  max stalled count: a job stalled more often than this fails
  ARGV[2]  guard, ms: when > 0, skip unless no check ran in that time (a
           longer guard left by another checker is cut down to it)
  ARGV[3]  at most this many jobs recovered per call
  Returns  the ids recovered (requeued or failed)
  Events   stalled, then waiting (requeued first in line) or failed (a job
           whose cancel was requested fails for good, with cancelled=1); drained
           when a job failed here and no job is left waiting or active
  Metrics  a failure counts in metrics:failed (see record_metric)
]]
local guard = tonumber(ARGV[2])
if guard > 0 and not redis.call('SET', base .. 'stalled-check', '1', 'PX', guard, 'NX') then
  -- a guard of a checker with a longer interval (a dead worker's, say),
  -- or one without a TTL (-1), holds this one back no longer than its own
  local left = redis.call('PTTL', base .. 'stalled-check')
  if left > guard or left == -1 then
    redis.call('PEXPIRE', base .. 'stalled-check', guard)
  end
  return {}
end
local max_stalled = tonumber(ARGV[1])
local limit = tonumber(ARGV[3])
local now = now_ms()
local out = {}
local failed_any = false
local ids = redis.call('ZRANGE', K_ACTIVE, '0', '-1')
for _, id in ipairs(ids) do
  if redis.call('EXISTS', lock_key(id)) == 0 then
    local jk = job_key(id)
    redis.call('ZREM', K_ACTIVE, id)
    if redis.call('EXISTS', jk) == 1 then
      local stalled = redis.call('HINCRBY', jk, 'stc', '1')
      local f = redis.call('HMGET', jk, 'atm', 'priority', 'cx')
      local atm = tonumber(f[1]) or 0
      emit('stalled', id, { 'attempt', atm + 1 })
      -- a stall is no attempt made (atm stays), but the `failed` event
      -- names the attempt that ended, as its `active` and `stalled` did
      if f[3] then  -- its cancel was requested (cancel.lua): it ends cancelled
        fail_for_good(id, f[3], atm + 1, now, 'active', true)
        failed_any = true
      elseif stalled > max_stalled then
        fail_for_good(id, 'job stalled more than allowable limit', atm + 1, now)
        failed_any = true
      else
        push_ready(id, tonumber(f[2]) or 0, true)
        redis.call('HSET', jk, 'state', 'waiting', 'rdy', now)
        emit('waiting', id, { 'prev', 'active' })
      end
    end
    out[#out + 1] = id
    if #out >= limit then break end
  end
end
if failed_any then emit_if_drained() end
return out
