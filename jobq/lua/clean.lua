#!lua flags=allow-oom
--[[
  Remove jobs of one state older than a grace period: one bounded step per
  call, the caller calling again with the cursor returned until it is ''.
  Finished jobs are aged by when they finished, others by when they were
  added. Allowed while the server is out of memory: it frees memory (its
  events are trimmed with the stream, MAXLEN ~).

  Work per call is O(batch): at most `batch` jobs are looked at (completed
  and failed: only jobs old enough are). Waiting jobs are read from the end
  of the wait list the workers take from, a slice per call (LRANGE, which
  reaches a slice in O(slice + depth / list node size)); the jobs removed
  leave the list in one command: LTRIM when they are its last entries (the
  common case: the oldest jobs are next in line), else one LREM of the
  entries overwritten with a tombstone, a scan in C from the nearer end of
  the list to the slice.

  KEYS[1]  queue base prefix
  ARGV[1]  state: completed | failed | delayed | waiting | waiting-children
  ARGV[2]  grace, ms
  ARGV[3]  batch: jobs looked at (and at most removed) per call, >= 1
  ARGV[4]  cursor: '' on the first call, then the one the previous call
           returned (how far the scan got)
  Flows    a child removed is dropped from its parent, which moves on if
           it was the last; a parent removed detaches its children
  Returns  {ids removed, next cursor ('' when done)}
  Events   removed (prev: the state) per job removed; then cleaned (count,
           state) when any was
  Dedup    releases each removed job's dedup key, whatever its mode
]]
local state = ARGV[1]
local grace = tonumber(ARGV[2])
local batch = tonumber(ARGV[3])
local cursor = ARGV[4] or ''
if state ~= 'completed' and state ~= 'failed' and state ~= 'delayed' and state ~= 'waiting'
    and state ~= 'waiting-children' then
  return redis.error_reply('ERR clean: unknown state ' .. tostring(state))
end
if not grace or grace < 0 or not batch or batch < 1 then
  return redis.error_reply('ERR clean: bad grace or batch')
end
local cutoff = now_ms() - grace
local TOMBSTONE = ''  -- never a job id (ids are non-empty)
local out = {}
local nxt = ''

-- Whether a listed job is to go: added before the cutoff, and still in
-- the state being cleaned (an id whose record is gone goes too).
local function old(id)
  local f = redis.call('HMGET', job_key(id), 'ts', 'state')
  if not f[2] then return true end
  if f[2] ~= state then return false end
  local ts = tonumber(f[1])
  return ts == nil or ts <= cutoff
end

-- A slice of a sorted set by rank, from `offset`: remove the old ones.
local function scan_zset(key, offset)
  local ids = redis.call('ZRANGE', key, offset, offset + batch - 1)
  local kept = 0
  for _, id in ipairs(ids) do
    if old(id) then out[#out + 1] = id else kept = kept + 1 end
  end
  if #out > 0 then redis.call('ZREM', key, unpack(out)) end
  if #ids < batch then return nil end
  return offset + kept
end

if state == 'completed' or state == 'failed' then
  local set = base .. state
  out = redis.call('ZRANGEBYSCORE', set, '-inf', cutoff, 'LIMIT', '0', batch)
  if #out > 0 then redis.call('ZREM', set, unpack(out)) end
  if #out == batch then nxt = 'z' end
elseif state == 'delayed' or state == 'waiting-children' then
  local set = K_DELAYED
  if state ~= 'delayed' then set = base .. 'waiting-children' end
  local offset = scan_zset(set, tonumber(string.match(cursor, '^z(%d+)$')) or 0)
  if offset then nxt = 'z' .. offset end
elseif string.sub(cursor, 1, 1) == 'p' then
  local offset = scan_zset(K_PRIO, tonumber(string.match(cursor, '^p(%d+)$')) or 0)
  if offset then nxt = 'p' .. offset end
else
  -- the wait list, from its right end (the next job to run) leftwards;
  -- `skip` entries at that end were looked at before and kept
  local skip = tonumber(string.match(cursor, '^w(%d+)$')) or 0
  local ids = redis.call('LRANGE', K_WAIT, -(skip + batch), -(skip + 1))
  local gone = {}  -- distances from the right end of the entries to remove
  local at_end = skip == 0  -- whether they are all the list's last entries
  for i = #ids, 1, -1 do
    local from_end = skip + #ids - i
    if old(ids[i]) then
      out[#out + 1] = ids[i]
      gone[#gone + 1] = from_end
      if from_end ~= #gone - 1 then at_end = false end
    end
  end
  if #gone > 0 and at_end then
    redis.call('LTRIM', K_WAIT, '0', -(#gone + 1))
  elseif #gone > 0 then
    for _, from_end in ipairs(gone) do
      redis.call('LSET', K_WAIT, -(from_end + 1), TOMBSTONE)
    end
    local len = redis.call('LLEN', K_WAIT)
    if skip + #ids <= len - skip then  -- nearer the right end
      redis.call('LREM', K_WAIT, -#gone, TOMBSTONE)
    else
      redis.call('LREM', K_WAIT, #gone, TOMBSTONE)
    end
  end
  if #ids < batch then nxt = 'p0' else nxt = 'w' .. (skip + #ids - #gone) end
end

for _, id in ipairs(out) do
  delete_job(id, true)
  emit('removed', id, { 'prev', state })
end
if #out > 0 then emit('cleaned', false, { 'count', #out, 'state', state }) end
return { out, nxt }
