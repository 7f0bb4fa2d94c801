#!lua flags=allow-oom
--[[
  Remove one job, whatever its state, unless it is active and locked.
  Allowed while the server is out of memory: it frees memory (its one event
  is trimmed with the stream, MAXLEN ~).

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  Returns  1 removed; 0 no such job; -2 active with its lock held
  Events   removed (prev: the state it was in)
  Dedup    releases the job's dedup key, whatever its mode
  Flows    a child is dropped from its parent's pending children (the
           parent moves on if it was the last); a parent's children are
           detached (they run on; see delete_job)
  Schedulers  a scheduler's pending tick removed: the next tick is produced
           now, at the schedule's following time
  Cost     O(1), but for a waiting job one LREM that stops at the id (a scan
           of the wait list from its newest end, in C)
]]
local id = ARGV[1]
local f = redis.call('HMGET', job_key(id), 'state', 'sch', 'slot')
local state = f[1]
if not state then return 0 end
if state == 'active' and redis.call('EXISTS', lock_key(id)) == 1 then return -2 end
if state == 'waiting' then
  if redis.call('ZREM', K_PRIO, id) == 0 then redis.call('LREM', K_WAIT, '1', id) end
elseif state == 'delayed' then
  redis.call('ZREM', K_DELAYED, id)
elseif state == 'active' then
  redis.call('ZREM', K_ACTIVE, id)
elseif state == 'completed' then
  redis.call('ZREM', K_COMPLETED, id)
elseif state == 'failed' then
  redis.call('ZREM', K_FAILED, id)
elseif state == 'waiting-children' then
  redis.call('ZREM', base .. 'waiting-children', id)
end
delete_job(id, true)
emit('removed', id, { 'prev', state })
-- a scheduler's pending tick: that run is skipped, the next comes at its time
if f[2] and f[3] and (state == 'waiting' or state == 'delayed') then
  advance_scheduler(f[2], f[3], now_ms())
end
return 1
