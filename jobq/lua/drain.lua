#!lua flags=allow-oom
--[[
  Remove waiting jobs (and delayed ones when asked), a batch per call.
  Allowed while the server is out of memory: it frees memory (its events
  are trimmed with the stream, MAXLEN ~). Work per call: O(batch).

  KEYS[1]  queue base prefix
  ARGV[1]  '1' to remove delayed jobs too
  ARGV[2]  batch size
  Returns  number of jobs removed (less than the batch size: done)
  Events   removed (prev: waiting | delayed) per job
  Dedup    releases each removed job's dedup key, whatever its mode
]]
local batch = tonumber(ARGV[2])
local removed = 0
local function take(ids, prev)
  for _, id in ipairs(ids) do
    delete_job(id, true)
    emit('removed', id, { 'prev', prev })
    removed = removed + 1
  end
end
take(redis.call('LPOP', K_WAIT, batch) or {}, 'waiting')
if removed < batch then
  local ids = redis.call('ZRANGE', K_PRIO, '0', batch - removed - 1)
  if #ids > 0 then redis.call('ZREM', K_PRIO, unpack(ids)) end
  take(ids, 'waiting')
end
if ARGV[1] == '1' and removed < batch then
  local ids = redis.call('ZRANGE', K_DELAYED, '0', batch - removed - 1)
  if #ids > 0 then redis.call('ZREM', K_DELAYED, unpack(ids)) end
  take(ids, 'delayed')
end
return removed
