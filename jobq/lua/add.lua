#!lua
--[[
  Add one or more jobs, atomically.

  KEYS[1]  queue base prefix
  ARGV[1]  N, the number of jobs
  ARGV[2]  '1': the jobs share their settings, ARGV[3..16] hold them once
           and each job is 4 values from ARGV[17] (job_id, name, data,
           opts); '0': each job is those 4 values and its 14 settings, 18
           values per job from ARGV[3]. A job's values:
           job_id ('' to generate one), name, data (msgpack), opts (msgpack);
           its settings: delay_ms, priority, lifo ('1' | '0'), attempts,
           keep_completed_count, keep_completed_age_ms,
           keep_failed_count, keep_failed_age_ms,
           dedup id ('' for none), dedup ttl ms (0: simple mode, the key
           holds until its job is finished), extend ('1' | '0'), replace
           ('1' | '0'), failure policy ('' or a code of fpol: what the
           job's failure does to a parent it has or will have), trace
           context ('' for none: sent only while tracing is on, stored as
           the record's tc; see jobq/_tracing.py)
           then optionally the caller's event mode, 'pubsub': checked to be
           the one stored
  Returns  {timestamp ms, id, duplicated, added, id, duplicated, added, ...}
           and then 'unset' when no Queue stored its settings (the meta
           field cfg is gone: a new queue, or a server that lost its data;
           the Queue stores them again), or another mode than the caller's
           is stored (settings stored again after a loss by a Queue that
           gave no mode)
           (duplicated: 0 added; 1 a job with that custom id already
           existed, left as it was; 2 deduplicated: id is the job that owns
           the dedup key, left as it was; 3 debounced: id is the owner, a
           delayed job whose name, data, options and delay were replaced by
           this add's; added: the id of its `added` event, the existing
           job's record (HGETALL) when duplicated is 1, else '')
  Events   added, then waiting (both in one stream entry) or delayed;
           duplicated for an existing id; deduplicated (dedup_id,
           existing_job_id) for a dedup hit, then delayed (prev delayed)
           when it debounced
  Dedup    the key dedup:<id> stores its owner's id (PX ttl in throttle
           mode; extend restarts the ttl on each hit). A hit counts while
           the owner is not finished (simple mode) or the key lives
           (throttle); a key whose owner is gone or finished is taken over.
           Debounce (replace) never touches a job that is not delayed. The
           job records its key (ddk; ddt when throttled): complete, fail,
           remove and cancel release it if it still names the job.

  Delayed jobs due at the same moment (a bulk add with one delay, or jobs
  of different calls whose delays end on the same microsecond of TIME) are
  promoted in the order they were added: see add_delayed in _common.lua.
]]
-- attempts and retention (settings 4..8), stored only when not the default
local SETTINGS = { 'atts', 'kc', 'ka', 'kfc', 'kfa' }
local DEFAULTS = { '1', '-1', '0', '-1', '0' }
local n, shared = tonumber(ARGV[1]), ARGV[2] == '1'
local now = now_ms()
-- as a string: a number reply would be truncated to whole ms, unlike the stored ts
local out = { fmt(now) }
-- the settings a debounce replaces on the pending job (others are kept)
local REPLACED = { 'priority', 'lifo', 'atts', 'kc', 'ka', 'kfc', 'kfa', 'fpol', 'tc' }
-- The owner of a dedup key if the key holds: 2 deduplicated, 3 debounced
-- (the owner, delayed, takes the add's content and delay), or nil.
-- `a`: the job's first value in ARGV; its settings from ARGV[s + 1].
local function dedup_hit(a, s, now)
  local ddk, ttl = ARGV[s + 9], tonumber(ARGV[s + 10])
  if ddk == '' then return nil end
  local key = base .. 'dedup:' .. ddk
  local owner = redis.call('GET', key)
  if not owner then return nil end
  local rec = redis.call('HMGET', job_key(owner), 'state', 'atm')
  local state = rec[1]
  -- the key's own mode decides: a throttle key (it has a ttl) holds until
  -- it expires; a simple one while its owner is not finished
  local throttled = redis.call('PTTL', key) > 0
  if not throttled and (not state or state == 'completed' or state == 'failed') then
    return nil  -- a simple key whose owner is finished or gone: stale
  end
  local delay = tonumber(ARGV[s + 1])
  -- a debounce replaces a job that has not run yet: one delayed for a retry
  -- (attempts made) has been active, and is deduplicated as an active one
  local replace = ARGV[s + 12] == '1' and state == 'delayed' and delay > 0
    and (tonumber(rec[2]) or 0) == 0
  -- the ttl restarts on extend, and on a replace (the key's job is new)
  if throttled and ttl > 0 and (ARGV[s + 11] == '1' or replace) then
    redis.call('PEXPIRE', key, ttl)
  end
  emit('deduplicated', owner, { 'dedup_id', ddk, 'existing_job_id', owner })
  if not replace then return owner, 2 end
  local run_at = now + delay
  local jk = job_key(owner)
  redis.call('HDEL', jk, unpack(REPLACED))
  local fields = { 'name', ARGV[a + 1], 'data', ARGV[a + 2], 'opts', ARGV[a + 3],
    'rdy', run_at, 'delay', delay }
  append(fields, { 'priority', ARGV[s + 2] })  -- delayed: see the add below
  if ARGV[s + 3] == '1' then append(fields, { 'lifo', '1' }) end
  for i, name in ipairs(SETTINGS) do
    if ARGV[s + 3 + i] ~= DEFAULTS[i] then append(fields, { name, ARGV[s + 3 + i] }) end
  end
  if ARGV[s + 13] ~= '' then append(fields, { 'fpol', ARGV[s + 13] }) end
  if ARGV[s + 14] ~= '' then append(fields, { 'tc', ARGV[s + 14] }) end  -- its trace too
  redis.call('HSET', jk, unpack(fields))
  add_delayed(owner, run_at)
  emit('delayed', owner, { 'delay', delay, 'run_at', run_at, 'prev', 'delayed' })
  return owner, 3
end
-- plain jobs made ready by a bulk, pushed together at the end (nothing in
-- between reads the wait list)
local ready = {}
local first, stride = 3, 18
if shared then first, stride = 17, 4 end
for j = 0, n - 1 do
  local a = first + j * stride
  local s = shared and 2 or a + 3  -- the job's settings: ARGV[s + 1 .. s + 14]
  local id = ARGV[a]
  local added = ''
  local owner, dup = dedup_hit(a, s, now)
  if owner then
    id = owner
  elseif id == '' then
    dup = 0
    id = tostring(redis.call('INCR', base .. 'id'))
  else
    -- an existing id: its record comes with the reply (a read after it may
    -- find the job finished and removed by its retention)
    local record = redis.call('HGETALL', job_key(id))
    if #record > 0 then
      dup = 1
      added = record
      emit('duplicated', id, {})
    else
      dup = 0
    end
  end
  if dup == 0 then
    local delay = tonumber(ARGV[s + 1])
    local priority = tonumber(ARGV[s + 2])
    local lifo = ARGV[s + 3]
    -- the event first: its entry id is the run's token, stored in the
    -- record's one HSET; a job ready now is one entry, `added` + `waiting`
    added = emit('added', id, { 'job_name', ARGV[a + 1], 'delay', ARGV[s + 1],
      'priority', ARGV[s + 2] }, delay <= 0 and 'waiting' or nil, true)
    local fields = { 'name', ARGV[a + 1], 'data', ARGV[a + 2], 'opts', ARGV[a + 3], 'ts', fmt(now),
      'run', added }
    local run_at = now
    if delay > 0 then
      run_at = now + delay
      append(fields, { 'state', 'delayed', 'rdy', run_at, 'delay', ARGV[s + 1] })
    else
      append(fields, { 'state', 'waiting', 'rdy', fmt(now) })
    end
    -- settings at their default are left out: readers take a missing field
    -- as its default (fewer fields: less memory and work per job). But a
    -- job that may be delayed (a delay, or attempts to retry after a
    -- backoff) keeps its priority: a 0.1 worker promotes a due delayed job
    -- only when its record has one, and drops one without it
    -- (docs/how-to/upgrade.md)
    if priority ~= 0 or delay > 0 or ARGV[s + 4] ~= '1' then
      append(fields, { 'priority', ARGV[s + 2] })
    end
    if lifo == '1' then append(fields, { 'lifo', lifo }) end
    for i, name in ipairs(SETTINGS) do
      local value = ARGV[s + 3 + i]
      if value ~= DEFAULTS[i] then append(fields, { name, value }) end
    end
    local ddk = ARGV[s + 9]
    if ddk ~= '' then
      local ttl = tonumber(ARGV[s + 10])
      if ttl > 0 then
        redis.call('SET', base .. 'dedup:' .. ddk, id, 'PX', ARGV[s + 10])
        append(fields, { 'ddk', ddk, 'ddt', '1' })
      else
        redis.call('SET', base .. 'dedup:' .. ddk, id)
        append(fields, { 'ddk', ddk })
      end
    end
    if ARGV[s + 13] ~= '' then append(fields, { 'fpol', ARGV[s + 13] }) end
    if ARGV[s + 14] ~= '' then append(fields, { 'tc', ARGV[s + 14] }) end
    redis.call('HSET', job_key(id), unpack(fields))
    if delay > 0 then
      add_delayed(id, run_at)
      emit('delayed', id, { 'delay', ARGV[s + 1], 'run_at', run_at })
    elseif n > 1 and priority == 0 and lifo ~= '1' then
      ready[#ready + 1] = id
    else
      push_ready(id, priority, lifo == '1')
    end
  end
  out[#out + 1] = id
  out[#out + 1] = dup
  out[#out + 1] = added
end
push_waiting(ready)
local mode = ARGV[first + n * stride]  -- the caller's, after the jobs' values
if not meta()[6] or (mode and meta()[1] ~= mode) then out[#out + 1] = 'unset' end
return out
