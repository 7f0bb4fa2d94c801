#!lua flags=no-writes
--[[
  Read what a waiter needs of one run of a job, with the event checkpoint of
  the same instant: every event written before this call has an id <=
  checkpoint.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  the run's token (its `added` event's id in stream mode, then
           '#' and a generation after retries: see retry.lua), or '' for
           whatever run the record holds. A later generation of the run
           answers too: a job retried since its waiter's Job was made.
  ARGV[3]  optional: go on scanning the run's events after this id (the
           cursor of the previous call), else from the run's `added` event
  ARGV[4]  optional: '1' when the scan so far began at the `added` event
  Returns  {state or false, return value, failed reason, stack traces,
            last event id or '', final, cursor, anchored, the record's run
            token when the record answered, the failure's exception type
            name}; state is
           'cancelled' for a job that failed by a cancel (cancel.lua)
           The record answers when it is of that run. Else the result kept
           under result:<run> (see complete.lua), or the failure kept under
           failure:<run> (fail_for_good); else, in stream mode, the
           run's own events from its `added` event on, SCAN entries per
           call: its completed or failed event answers, and final = 1 when
           its `removed` event was found or none of its events ended it (it
           was deleted without one), the scan having begun at its `added`
           event. A scan cut short returns the cursor to go on from (and
           anchored = 1 when it began at the `added` event); final = false
           and no cursor: the reader's checkpoint decides.
]]
local SCAN = 2000
local id, run = ARGV[1], ARGV[2] or ''

-- A token's first part (the run's) and its generation.
local function generation(token)
  local first, gen = string.match(token, '^(.*)#(%d+)$')
  if first then return first, tonumber(gen) end
  return token, 0
end
local first, gen = generation(run)
-- Whether a token (of the record or an event) is of this run, at the
-- waiter's generation or a later one.
local function answers(token)
  local f, g = generation(token)
  return f == first and g >= gen
end
local f = redis.call('HMGET', job_key(id), 'state', 'rv', 'fr', 'st', 'run', 'cx', 'et')
if f[1] == 'failed' and f[6] then f[1] = 'cancelled' end
local stream = meta()[1] ~= 'pubsub'
local last = ''
if stream then
  local e = redis.call('XREVRANGE', K_EVENTS, '+', '-', 'COUNT', '1')
  if e[1] then last = e[1][1] end
end
if f[1] and (run == '' or not f[5] or answers(f[5])) then
  return { f[1], f[2], f[3], f[4], last, false, false, false, f[5] or false, f[7] or false }
end
if run == '' then return { false, false, false, false, last, false } end
local kept = redis.call('GET', base .. 'result:' .. run)
if kept then return { 'completed', kept, false, false, last, false } end
kept = redis.call('GET', base .. 'failure:' .. run)
if kept then  -- state, exception type, reason (the reason last: it may hold newlines)
  local state, exc_type, reason = string.match(kept, '^(%a+)\n([^\n]*)\n(.*)$')
  if state then
    return { state, false, reason, false, last, false, false, false, false,
             exc_type ~= '' and exc_type or false }
  end
end
if not stream or last == '' or not string.match(first, '^%d+%-%d+$') then
  return { false, false, false, false, last, false }
end
local cursor = ARGV[3] or ''
local start = first
if cursor ~= '' then start = '(' .. cursor end
local entries = redis.call('XRANGE', K_EVENTS, start, last, 'COUNT', SCAN)
-- the end of the latest generation among those read: a run failed, retried
-- (by another Job than the waiter's) and ended again answers with its last
-- end, not its first (the first answered: a stale failure)
local best, best_name, best_gen
for _, entry in ipairs(entries) do
  local e = entry[2]
  -- every job event starts with ev, name, jid, id
  if e[4] == id and RUN_ENDS[e[2]] then
    local got = {}
    for i = 5, #e, 2 do got[e[i]] = e[i + 1] end
    if not got['run'] or answers(got['run']) then
      local _, g = generation(got['run'] or run)
      -- a generation's completed or failed, not the removed that follows it
      if not best or g > best_gen or (g == best_gen and best_name == 'removed') then
        best, best_name, best_gen = got, e[2], g
      end
    end
  end
end
if best then
  local token = best['run']
  if token and token ~= run then  -- a later generation's outcome kept apart
    local kept = redis.call('GET', base .. 'result:' .. token)
    if kept then return { 'completed', kept, false, false, last, false } end
  end
  if best_name == 'completed' and best['result'] then
    return { 'completed', best['result'], false, false, last, false }
  elseif best_name == 'failed' then
    local state = 'failed'
    if best['cancelled'] then state = 'cancelled' end
    return { state, false, best['failed_reason'] or '', false, last, false, false, false,
             false, best['exc_type'] or false }
  end
  -- removed, or a big result whose record and kept copy are gone
  return { false, false, false, false, last, 1 }
end
local anchored
if cursor == '' then
  anchored = entries[1] ~= nil and entries[1][1] == first
else
  anchored = ARGV[4] == '1'
end
local n = #entries
if n == SCAN and entries[n][1] ~= last then
  return { false, false, false, false, last, false, entries[n][1], anchored and 1 or false }
end
local whole = anchored and (n == 0 or entries[n][1] == last)
return { false, false, false, false, last, whole and 1 or false }
