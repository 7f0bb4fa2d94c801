#!lua flags=allow-oom
--[[
  Finish an active job successfully.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  lock token of the attempt
  ARGV[3]  return value (msgpack)
  ARGV[4..8] optional: take the worker's next job in the same call (token,
           lock ms, worker, limit max, limit ms; as moveToActive.lua)
  ARGV[9]  optional: 'r' the job a first run of this call took with that
           token, if any, but no new one (see and_take_next)
  Returns  {1, now} done, now the server time (ms, a string); {3, now,
           next or nil, reason} the job's cancel was requested while it ran
           (cancel.lua): the result is discarded and the job failed for good
           with the cancel's reason (event failed, with cancelled=1);
           {1, now, next}
           with moveToActive's reply when asked to take the next job;
           {0, now[, next]} already done by this token (a retried call; next
           is the job the first call took with the same take token, if
           still locked by it); -1 job missing; -2 lock not held
  Events   completed, with the run's token and the result when it is at
           most INLINE_RESULT bytes (1 KiB; else a `big` marker: the result
           is in the record), so that a retained event stays small;
           then those of the take when asked; then drained when no job is
           left waiting or active
  Results  a result that may outlive its record is also written to
           result:<run> for the queue's result TTL (meta rttl, ms): one over
           1 KiB of a job with any retention rule, and any result of a job
           removed on completion (its event alone was lost to a waiter once
           trimmed, and pub/sub mode has no replay); a job failed for good
           and removed so has failure:<run> (see fail_for_good)
  Metrics  counts the job in metrics:completed (see record_metric)
  Dedup    releases the job's simple-mode dedup key (see release_dedup)
  Flows    a child's result is copied to its parent (processed:<parent>),
           and a parent whose last child this was moves on in this call
           (waiting or delayed, prev waiting-children, in its own queue)
]]
-- Longest result (bytes, encoded) carried in the `completed` event itself:
-- at the default max_events a stream of bigger ones would hold tens of MB.
local INLINE_RESULT = 1024
local id, token, result = ARGV[1], ARGV[2], ARGV[3]
local jk = job_key(id)
local refused = not_owner(id, token)
if refused == 0 then return and_take_next(0, 4, now_ms()) end
if refused then return refused end
local now = now_ms()
-- one read of the record: the cancel mark first, then what finishing needs
local f = redis.call('HMGET', jk, 'atm', 'pon', 'rdy', 'delay', 'kc', 'ka', 'run', 'ddk', 'ddt',
  'cx', 'pid', 'pqb')
if f[10] then  -- cancel requested while it ran: it ends failed, result discarded
  end_cancelled(id, token, f[10], now)
  local reply = cancelled_reply(4, now, f[10])
  emit_if_drained()
  return reply
end
release_dedup(id, f[8], f[9], false)
local atm = (tonumber(f[1]) or 0) + 1
local run = f[7]
if run then _runs[id] = run end
redis.call('DEL', lock_key(id))
redis.call('ZREM', K_ACTIVE, id)
local fields = append({ 'prev', 'active' },
  finish_metrics('completed', f[2], f[3], f[4], atm, now))
local keep = tonumber(f[5]) or -1
local removable = keep ~= -1 or (tonumber(f[6]) or 0) > 0
if keep == 0 then
  delete_job(id, false, true)
else
  redis.call('HSET', jk, 'state', 'completed', 'rv', result, 'fon', fmt(now), 'atm', int(atm),
    'ftok', token)
  retain(K_COMPLETED, id, now, keep, tonumber(f[6]) or 0)
end
local big = string.len(result) > INLINE_RESULT
if run and ((big and removable) or keep == 0) then
  -- the record may be gone before a waiter looks: keep the result a while
  redis.call('SET', base .. 'result:' .. run, result, 'PX', meta()[4])
elseif big and removable then
  big = false  -- a job from before run tokens: the event must carry it
end
if big then
  append(fields, { 'big', '1' })
else
  append(fields, { 'result', result })
end
emit('completed', id, fields)
-- a child: its result goes to its parent, which moves on if it was the last
if f[11] then notify_parent(id, f[11], f[12], 'completed', result, '', now) end
local reply = and_take_next(1, 4, now)
emit_if_drained()
return reply
