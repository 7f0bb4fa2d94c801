#!lua
--[[
  Add one or more jobs, atomically.

  KEYS[1]  queue base prefix
  ARGV[1]  N, the number of jobs; then 12 values per job:
           job_id ('' to generate one), name, data (msgpack), opts (msgpack),
           delay_ms, priority, lifo ('1' | '0'), attempts,
           keep_completed_count, keep_completed_age_ms,
           keep_failed_count, keep_failed_age_ms
  Returns  {timestamp ms, id, duplicated, added, id, duplicated, added, ...}
           (duplicated: 1 when a job with that custom id already existed; it
           is left as it was; added: the id of its `added` event, or '')
  Events   added, then waiting or delayed; duplicated for an existing id

  Delayed jobs of one call due at the same moment (a bulk add with one
  delay) are promoted in the order given: each is scored the next larger
  double after the previous one (a quarter of a microsecond apart today),
  not tied, which the sorted set would break by id string ("1", "10", "2").
  Jobs of different calls are due at different microseconds of TIME.
]]
-- attempts and retention (ARGV a+7 .. a+11), stored only when not the default
local SETTINGS = { 'atts', 'kc', 'ka', 'kfc', 'kfa' }
local DEFAULTS = { '1', '-1', '0', '-1', '0' }
-- the last score given in this call to a due time: ties get the next double
local last_score = {}
local function delayed_score(run_at)
  local score = last_score[run_at]
  if score then
    local _, e = math.frexp(score)
    score = score + math.ldexp(1, e - 53)
  else
    score = run_at
  end
  last_score[run_at] = score
  return score
end
local n = tonumber(ARGV[1])
local now = now_ms()
-- as a string: a number reply would be truncated to whole ms, unlike the stored ts
local out = { string.format('%.17g', now) }
for j = 0, n - 1 do
  local a = 2 + j * 12
  local id = ARGV[a]
  local dup = 0
  local added = ''
  if id == '' then
    id = tostring(redis.call('INCR', base .. 'id'))
  elseif redis.call('EXISTS', job_key(id)) == 1 then
    dup = 1
    emit('duplicated', id, {})
  end
  if dup == 0 then
    local delay = tonumber(ARGV[a + 4])
    local priority = tonumber(ARGV[a + 5])
    local lifo = ARGV[a + 6]
    local fields = { 'name', ARGV[a + 1], 'data', ARGV[a + 2], 'opts', ARGV[a + 3], 'ts', now }
    local run_at = now
    if delay > 0 then
      run_at = now + delay
      append(fields, { 'state', 'delayed', 'rdy', run_at, 'delay', delay })
    else
      append(fields, { 'state', 'waiting', 'rdy', now })
    end
    -- settings at their default are left out: readers take a missing field
    -- as its default (fewer fields: less memory and work per job)
    if priority ~= 0 then append(fields, { 'priority', priority }) end
    if lifo == '1' then append(fields, { 'lifo', lifo }) end
    for i, name in ipairs(SETTINGS) do
      local value = ARGV[a + 6 + i]
      if value ~= DEFAULTS[i] then append(fields, { name, value }) end
    end
    redis.call('HSET', job_key(id), unpack(fields))
    added = emit('added', id, { 'job_name', ARGV[a + 1], 'delay', delay, 'priority', priority })
    if delay > 0 then
      redis.call('ZADD', K_DELAYED, delayed_score(run_at), id)
      redis.call('ZADD', K_MARKER, 'LT', run_at, '1')
      emit('delayed', id, { 'delay', delay, 'run_at', run_at })
    else
      push_ready(id, priority, lifo == '1')
      emit('waiting', id, {})
    end
  end
  out[#out + 1] = id
  out[#out + 1] = dup
  out[#out + 1] = added
end
return out
