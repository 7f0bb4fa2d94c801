#!lua flags=allow-oom
--[[
  Cancel a job: one that is not running leaves the queue and fails for good
  at once; a running one gets a durable cancel mark (field cx, the reason)
  and a hint on the queue's cancel channel, and fails for good when its
  attempt ends (complete.lua and fail.lua read the mark; a worker checks it
  at take and at every lock renewal, and listens to the hint to set the
  running job's `cancelled` event at once).

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  reason (failed_reason of the job)
  Returns  1 cancelled (a job not running: failed now); 2 cancel requested
           (a running job), or already requested (nothing written);
           0 no such job, or finished already
  Events   cancelled (reason, prev), then failed (prev, failed_reason,
           attempt, metrics, cancelled=1) for a job not running; cancelled
           (prev active) only for a running one (its failed comes when the
           attempt ends)
  Dedup    releases the job's dedup key, whatever its mode, at once (a
           running job's too: an add after the cancel makes a new job)
  Schedulers  a scheduler's pending tick cancelled: the next tick is
           produced now, at the schedule's following time
  Pub/sub  SPUBLISH <base>cancels "<job id> <lock token>", for a running job
           whose lock is held (a channel's name has no database in it: the
           token tells the worker whose attempt it is)
]]
local id, reason = ARGV[1], ARGV[2]
local jk = job_key(id)
local f = redis.call('HMGET', jk, 'state', 'cx', 'atm', 'ddk', 'ddt', 'sch', 'slot')
local state = f[1]
if not state or state == 'completed' or state == 'failed' then return 0 end
if state == 'active' then
  if f[2] then return 2 end  -- being cancelled already
  -- its dedup key goes now: an add after the cancel makes a new job
  release_dedup(id, f[4], f[5], true)
  redis.call('HSET', jk, 'cx', reason)
  emit('cancelled', id, { 'reason', reason, 'prev', 'active' })
  local token = redis.call('GET', lock_key(id))
  if token then redis.call('SPUBLISH', base .. 'cancels', id .. ' ' .. token) end
  return 2
end
if state == 'waiting' then
  if redis.call('ZREM', K_PRIO, id) == 0 then redis.call('LREM', K_WAIT, '1', id) end
elseif state == 'delayed' then
  redis.call('ZREM', K_DELAYED, id)
elseif state == 'waiting-children' then
  redis.call('ZREM', base .. 'waiting-children', id)
end
local now = now_ms()
redis.call('HSET', jk, 'cx', reason, 'fr', reason)
emit('cancelled', id, { 'reason', reason, 'prev', state })
fail_for_good(id, reason, tonumber(f[3]) or 0, now, state, true)
-- a scheduler's pending tick: that run is skipped, the next comes at its time
if f[6] and f[7] then advance_scheduler(f[6], f[7], now) end
return 1
