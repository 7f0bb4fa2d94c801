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
           returned (how far the scan got: in a sorted set, a score and the
           kept jobs of that score looked at; in the wait list, the entries
           looked at and kept and the last of them)
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

-- A slice of a sorted set in score order, from where `cursor` (its
-- `prefix`, then 'n:score') left off: remove the old ones; return the next
-- cursor, or nil at the set's end. The cursor is the last score looked at
-- and how many kept members of that score were, not a rank: jobs leaving
-- the set between two calls (promoted, taken, removed) must not shift the
-- next slice past jobs never looked at.
local function scan_zset(key, prefix)
  local n, from = string.match(cursor, '^' .. prefix .. '(%d+):(.+)$')
  from, n = from or '-inf', tonumber(n) or 0
  local got = redis.call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', 0, n + batch)
  local last, kept, looked = from, 0, 0
  for i = 1, #got, 2 do
    local id, score = got[i], got[i + 1]
    if score == from and i <= 2 * n and looked == 0 then
      kept = kept + 1  -- looked at by the last call, and kept
    elseif looked < batch then
      looked = looked + 1
      if score ~= last then last, kept = score, 0 end
      if old(id) then out[#out + 1] = id else kept = kept + 1 end
    end
  end
  if #out > 0 then redis.call('ZREM', key, unpack(out)) end
  if #got < 2 * (n + batch) then return nil end
  return prefix .. kept .. ':' .. last
end

if state == 'completed' or state == 'failed' then
  local set = base .. state
  out = redis.call('ZRANGEBYSCORE', set, '-inf', cutoff, 'LIMIT', '0', batch)
  if #out > 0 then redis.call('ZREM', set, unpack(out)) end
  if #out == batch then nxt = 'z' end
elseif state == 'delayed' or state == 'waiting-children' then
  local set = K_DELAYED
  if state ~= 'delayed' then set = base .. 'waiting-children' end
  nxt = scan_zset(set, 'z') or ''
elseif string.sub(cursor, 1, 1) == 'p' then
  nxt = scan_zset(K_PRIO, 'p') or ''
else
  -- the wait list, from its right end (the next job to run) leftwards;
  -- `skip` entries at that end were looked at before and kept, the last
  -- of them `mark`. Workers take from that end and lifo jobs join it
  -- between two calls: the mark is looked for near where it was, and the
  -- scan goes on from it (from the end again when it is gone)
  local skip, mark = string.match(cursor, '^w(%d+):(.*)$')
  skip = tonumber(skip) or 0
  local ids
  if skip > 0 then  -- the slice, and the mark where it was at its right
    ids = redis.call('LRANGE', K_WAIT, -(skip + batch), -skip)
    if ids[#ids] == mark then
      ids[#ids] = nil
    else
      local near = math.max(1, skip - batch)
      local window = redis.call('LRANGE', K_WAIT, -(skip + batch), -near)
      local found = 0
      for i = #window, 1, -1 do
        if window[i] == mark then found = near + #window - i break end
      end
      skip, ids = found, nil
    end
  end
  ids = ids or redis.call('LRANGE', K_WAIT, -(skip + batch), -(skip + 1))
  local gone = {}  -- distances from the right end of the entries to remove
  local at_end = skip == 0  -- whether they are all the list's last entries
  local removed = {}  -- by index in ids
  for i = #ids, 1, -1 do
    local from_end = skip + #ids - i
    if old(ids[i]) then
      out[#out + 1] = ids[i]
      removed[i] = true
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
  if #ids < batch then
    nxt = 'p'
  else
    -- the leftmost entry looked at and kept (none: the mark stays)
    for i = 1, #ids do
      if not removed[i] then mark = ids[i] break end
    end
    nxt = 'w' .. (skip + #ids - #gone) .. ':' .. (mark or '')
  end
end

for _, id in ipairs(out) do
  delete_job(id, true)
  emit('removed', id, { 'prev', state })
end
if #out > 0 then emit('cleaned', false, { 'count', #out, 'state', state }) end
return { out, nxt }
