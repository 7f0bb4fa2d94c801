#!lua flags=allow-oom
--[[
  Remove waiting jobs (and delayed ones when asked), a batch per call.
  Allowed while the server is out of memory: it frees memory (its events
  are trimmed with the stream, MAXLEN ~). Work per call: O(batch).

  KEYS[1]  queue base prefix
  ARGV[1]  '1' to remove delayed jobs too
  ARGV[2]  batch size
  ARGV[3]  the drain's start (server ms, returned by its first call); 0 in
           the first call
  Returns  {jobs removed, jobs looked at (less than the batch size: done),
           the drain's start, the ids of the schedulers' ticks removed (the
           caller makes each scheduler's next tick once the drain is over:
           made here, a later call of the drain would remove it)}
  Events   removed (prev: waiting | delayed) per job
  Dedup    releases each removed job's dedup key, whatever its mode
  Flows    a parent of this queue that the drain's removal of its last
           children released (its rel at or after the drain's start) stays:
           put back at the end of the wait list taken first, or left in the
           prioritized or delayed set, it runs
]]
local batch = tonumber(ARGV[2])
local since = tonumber(ARGV[3])
if since == 0 then since = now_ms() end
local removed, looked = 0, 0
local ticks = {}
local function released(id)
  local f = redis.call('HMGET', job_key(id), 'rel', 'sch')
  if (tonumber(f[1]) or 0) >= since then return true end
  if f[2] then ticks[#ticks + 1] = id end
  return false
end
-- the ids to keep go back where they were (a list) or stay (a sorted set)
local function take(ids, prev, kept)
  for _, id in ipairs(ids) do
    looked = looked + 1
    if released(id) then
      kept[#kept + 1] = id
    else
      delete_job(id, true)
      emit('removed', id, { 'prev', prev })
      removed = removed + 1
    end
  end
end
local function take_set(key, prev)
  local ids = redis.call('ZRANGE', key, '0', batch - looked - 1)
  local kept = {}
  take(ids, prev, kept)
  local gone = {}
  local keep = {}
  for _, id in ipairs(kept) do keep[id] = true end
  for _, id in ipairs(ids) do if not keep[id] then gone[#gone + 1] = id end end
  if #gone > 0 then redis.call('ZREM', key, unpack(gone)) end
end
local kept = {}
take(redis.call('LPOP', K_WAIT, batch) or {}, 'waiting', kept)
if #kept > 0 then redis.call('RPUSH', K_WAIT, unpack(kept)) end
if looked < batch then take_set(K_PRIO, 'waiting') end
if ARGV[1] == '1' and looked < batch then take_set(K_DELAYED, 'delayed') end
return { removed, looked, since, ticks }
