#!lua flags=allow-oom
--[[
  Keep a scheduler going: the workers' periodic check (for schedulers whose
  next run is due) and a worker that took a tick call it. When the pending
  tick job exists (waiting or delayed, never taken), fill in the cron slot
  after it; when it is no longer pending, produce the next tick: one job,
  however many ticks were missed. A pending tick leaves without producing the next one
  when it is taken before the slot after it was known (a cron tick), or
  cancelled or removed: a cancelled one may leave no record (retention), so
  a tick whose record is gone counts as ended, never as lost, and is not
  produced again (its run is skipped, the schedule goes on).

  KEYS[1]  queue base prefix
  ARGV[1]  scheduler id
  ARGV[2]  the scheduler's next slot as the caller read it ('' none): the
           call does nothing when it changed since (compare-and-set)
  ARGV[3]  cron: the slot after that next one ('' for every)
  ARGV[4]  cron: the first slot after max(next, now) ('' for every: computed
           here, on the grid of the previous slot)
  ARGV[5]  cron: the slot after ARGV[4] ('' for every)
  Returns  0 nothing to do (removed, over, or changed since read); 1 the
           pending tick is there (after filled in when it was missing); 2 the
           next tick was produced; 3 the schedule ended (end or limit);
           -5 the tick's id collides with an existing job (err recorded)
  Events   those of a produced tick: added, then delayed or waiting
]]
local sid = ARGV[1]
local skey = base .. 'scheduler:' .. sid
local s = redis.call('HMGET', skey, 'spec', 'next', 'every', 'after')
if not s[1] or (s[2] or '') ~= ARGV[2] or ARGV[2] == '' then return 0 end
local now = now_ms()
local pending = tonumber(s[2])
-- a tick taken before the slot after it was known, that failed into a
-- retry's backoff (or stalled) before this call, is no longer pending: its
-- retry must not hold the schedule back for the backoff
local state = untaken_tick(tick_id(sid, pending))
if state == 'waiting' or state == 'delayed' then
  if (not s[4] or s[4] == '') and ARGV[3] ~= '' then redis.call('HSET', skey, 'after', ARGV[3]) end
  return 1
end
local slot, after
local every = tonumber(s[3])
if every then
  slot, after = every_after(tonumber(s[2]), every, now), ''
else
  slot, after = tonumber(ARGV[4]), ARGV[5]
  if not slot then return 0 end
end
local id = schedule_tick(sid, math.floor(slot), after, now)
if id == false then return -5 end
if not id then return 3 end
return 2
