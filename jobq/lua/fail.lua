#!lua flags=allow-oom
--[[
  End a failed attempt of an active job: retry it, or fail it for good.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  lock token of the attempt
  ARGV[3]  failed reason
  ARGV[4]  stack traces so far, newest last (msgpack list)
  ARGV[5]  retry delay in ms; -1 forbids a retry (unrecoverable)
  ARGV[6]  the type name of the exception that failed the attempt, or ''
  ARGV[7..11] optional: take the worker's next job in the same call
  ARGV[12] optional: 'r' the job a first run of this call took with that
           token, if any, but no new one (see and_take_next)
  Returns  {1, now} failed for good; {2, now} retry scheduled; now the
           server time (ms, a string); {3, now, next or nil, reason} the
           job's cancel was requested (cancel.lua): failed for good with the
           cancel's reason, no retry, whatever ARGV[5] says; {code, now, next} when asked to take
           the next job (next as moveToActive.lua returns it); {0, now[, next]}
           already done by this token (a retried call, as complete.lua);
           -1 job missing; -2 lock not held
  Events   retrying, then waiting or delayed; or failed (terminal only). A
           retry at once first promotes the delayed jobs already due
           (waiting, prev delayed, each), so they run before it. Then those
           of the take when asked; then drained when no job is left waiting
           or active
  Metrics  a terminal failure counts in metrics:failed (see record_metric)
  Flows    a child's terminal failure applies its failure policy to its
           parent in this call (see fail_for_good)
]]
local id, token, reason, exc_type = ARGV[1], ARGV[2], ARGV[3], ARGV[6]
local jk = job_key(id)
local refused = not_owner(id, token)
if refused == 0 then return and_take_next(0, 7, now_ms()) end
if refused then return refused end
local now = now_ms()
local f = redis.call('HMGET', jk, 'atm', 'atts', 'priority', 'cx', 'lifo')
if f[4] then  -- cancelled: no retry, and the reason is the cancel's
  redis.call('HSET', jk, 'st', ARGV[4])
  end_cancelled(id, token, f[4], now)
  local reply = cancelled_reply(7, now, f[4])
  emit_if_drained()
  return reply
end
local atm = (tonumber(f[1]) or 0) + 1
local delay = tonumber(ARGV[5])
redis.call('DEL', lock_key(id))
redis.call('ZREM', K_ACTIVE, id)
redis.call('HSET', jk, 'atm', atm, 'fr', reason, 'et', exc_type, 'st', ARGV[4], 'ftok', token)

if delay >= 0 and atm < (tonumber(f[2]) or 1) then
  emit('retrying', id, { 'attempt', atm, 'failed_reason', reason, 'exc_type', exc_type,
    'delay', delay, 'prev', 'active' })
  if delay > 0 then
    local run_at = now + delay
    redis.call('ZADD', K_DELAYED, run_at, id)
    -- with its priority, for a 0.1 worker's take (see add.lua)
    redis.call('HSET', jk, 'state', 'delayed', 'rdy', run_at, 'priority', f[3] or '0')
    mark_due(run_at)
    emit('delayed', id, { 'delay', delay, 'run_at', run_at, 'prev', 'active' })
  else
    promote_due(now)  -- delayed jobs already due were ready first: they run first
    -- first in line again when lifo, as after a backoff (see promote_due)
    push_ready(id, tonumber(f[3]) or 0, f[5] == '1')
    redis.call('HSET', jk, 'state', 'waiting', 'rdy', now)
    emit('waiting', id, { 'prev', 'active' })
  end
  local reply = and_take_next(2, 7, now)
  emit_if_drained()
  return reply
end

fail_for_good(id, reason, atm, now, 'active', false, exc_type)
local reply = and_take_next(1, 7, now)
emit_if_drained()
return reply
