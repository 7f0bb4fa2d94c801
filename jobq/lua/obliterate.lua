#!lua flags=allow-oom
--[[
  Delete a queue and all its jobs, a batch of jobs per call. Allowed while
  the server is out of memory: it frees memory. Work per call: O(batch),
  plus, in the last call, the queue's bounded keys (event stream, metrics,
  worker registry) and its job schedulers.

  Kept, so that the queue's name stays usable as it was: its settings (event
  mode, max_events; only the paused flag is cleared), the generated-id
  counter (ids stay unique for the life of the queue's name), and the event
  stream itself, emptied but not deleted (its last id stays, so a reader
  blocked on it reads the `obliterated` event that follows). The outcomes
  kept apart for waiters (result:<run>, failure:<run>) are not found here:
  Queue.obliterate deletes them after its last call, by SCAN.

  KEYS[1]  queue base prefix
  ARGV[1]  '1' to proceed even with active jobs
  ARGV[2]  batch size
  ARGV[3..] the queue's keys to delete once its jobs are gone (suffixes of
           the base: keys.OBLITERATED, derived from the schema in keys.py)
  Returns  jobs deleted in this call (less than the batch size: the queue is
           gone; the batch size when a deleted child released a parent of
           this queue into the wait list: the next call deletes it); -4
           when active jobs exist and force is not set (then nothing is
           deleted: each call pauses the queue, so only the first
           can find a job active that it did not find before)
  Flows    each child deleted is dropped from its parent (in any queue),
           which moves on if it was the last; parents' children elsewhere
           are detached (see delete_job)
  Events   obliterated (no job id), once, by the last call, after every
           job and key is gone: readers re-check whoever waits on a job
  Dedup    releases each deleted job's dedup key, whatever its mode (a
           throttle key whose job retention removed is found by no job:
           Queue.obliterate deletes it after the last call, by SCAN)
]]
if ARGV[1] ~= '1' and redis.call('ZCARD', K_ACTIVE) > 0 then return -4 end
-- held paused until the last call clears the flag: a worker taking a job
-- between two calls would make the next one refuse, part of the queue gone
redis.call('HSET', K_META, 'paused', '1')
local batch = tonumber(ARGV[2])
local n = 0
for _, id in ipairs(redis.call('LPOP', K_WAIT, batch) or {}) do
  delete_job(id, true)
  n = n + 1
end
for _, key in ipairs({ K_PRIO, K_DELAYED, K_ACTIVE, K_COMPLETED, K_FAILED,
    base .. 'waiting-children' }) do
  if n >= batch then break end
  local ids = redis.call('ZRANGE', key, '0', batch - n - 1)
  for _, id in ipairs(ids) do
    delete_job(id, true)
    n = n + 1
  end
  if #ids > 0 then redis.call('ZREM', key, unpack(ids)) end
end
local function any_left()
  if redis.call('LLEN', K_WAIT) > 0 then return true end
  for _, key in ipairs({ K_PRIO, K_DELAYED, K_ACTIVE, K_COMPLETED, K_FAILED,
      base .. 'waiting-children' }) do
    if redis.call('ZCARD', key) > 0 then return true end
  end
  return false
end
if n < batch and any_left() then return batch end  -- another call deletes them
if n < batch then
  for _, name in ipairs(redis.call('ZRANGE', base .. 'workers', '0', '-1')) do
    redis.call('DEL', base .. 'worker:' .. name)
  end
  for _, sid in ipairs(redis.call('ZRANGE', base .. 'schedulers', '0', '-1')) do
    redis.call('DEL', base .. 'scheduler:' .. sid)
  end
  for i = 3, #ARGV do redis.call('DEL', base .. ARGV[i]) end
  redis.call('HDEL', K_META, 'paused')
  if redis.call('EXISTS', K_EVENTS) == 1 then redis.call('XTRIM', K_EVENTS, 'MAXLEN', '0') end
  emit('obliterated', false, {})
end
return n
