#!lua flags=allow-oom
--[[
  Finish an active job successfully.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  lock token of the attempt
  ARGV[3]  return value (msgpack)
  ARGV[4..8] optional: take the worker's next job in the same call (token,
           lock ms, worker, limit max, limit ms; as moveToActive.lua)
  Returns  {1, now} done, now the server time (ms, a string); {1, now, next}
           with moveToActive's reply when asked to take the next job;
           {0, now[, next]} already done by this token (a retried call; next
           is the job the first call took with the same take token, if
           still locked by it); -1 job missing; -2 lock not held
  Events   completed, with the result when it is at most 16 KiB or the job
           has a retention rule (else the result stays in the record only);
           then those of the take when asked; then drained when no job is
           left waiting or active
  Metrics  counts the job in metrics:completed (see record_metric)
]]
local id, token, result = ARGV[1], ARGV[2], ARGV[3]
local jk = job_key(id)
local refused = not_owner(id, token)
if refused == 0 then return and_take_next(0, 4, now_ms()) end
if refused then return refused end
local now = now_ms()
local f = redis.call('HMGET', jk, 'atm', 'pon', 'rdy', 'delay', 'kc', 'ka')
local atm = (tonumber(f[1]) or 0) + 1
redis.call('DEL', lock_key(id))
redis.call('ZREM', K_ACTIVE, id)
local fields = append({ 'prev', 'active' }, metrics(f[2], f[3], f[4], atm, now))
record_metric('completed', now, f[2], f[3])
local keep = tonumber(f[5]) or -1
if keep == 0 then
  delete_job(id)
  append(fields, { 'result', result })
else
  redis.call('HSET', jk, 'state', 'completed', 'rv', result, 'fon', now, 'atm', atm,
    'ftok', token)
  retain(K_COMPLETED, id, now, keep, tonumber(f[6]) or 0)
  -- a job that a retention rule may remove before its event is read keeps
  -- its result in the event, whatever its size
  if string.len(result) <= 16384 or keep ~= -1 or (tonumber(f[6]) or 0) > 0 then
    append(fields, { 'result', result })
  else
    append(fields, { 'big', '1' })
  end
end
emit('completed', id, fields)
local reply = and_take_next(1, 4, now)
emit_if_drained()
return reply
