#!lua flags=allow-oom
--[[
  Create or replace a job scheduler, and produce its first tick job.

  KEYS[1]  queue base prefix
  ARGV[1]  scheduler id
  ARGV[2]  every, ms ('' for cron)
  ARGV[3]  cron expression ('' for every)
  ARGV[4]  tz (IANA name; '' for every)
  ARGV[5]  start ms ('' none)      ARGV[6]  end ms ('' none)
  ARGV[7]  limit ('' none)         ARGV[8]  immediately ('1' | '0')
  ARGV[9]  spec: the schedule in one canonical string (ARGV[2..8]); an
           upsert with the stored spec changes the template only (of the
           scheduler and of its pending tick)
  ARGV[10] cron: the first slot, ms, computed in Python from now (server
           TIME) or start, zone-aware ('' for every)
  ARGV[11] cron: the slot after it ('' for every)
  ARGV[12..22] the job template: name, data (msgpack), opts (msgpack),
           priority, lifo, attempts, keep_completed_count,
           keep_completed_age_ms, keep_failed_count, keep_failed_age_ms,
           trace context (each '' when at its default: not stored)
  ARGV[23] optionally the caller's event mode, 'pubsub': checked to be the
           one stored (as add.lua's)
  Returns  {0, next, record}  (record: the scheduler's hash as stored, as
                      HGETALL returns it) the same schedule: template replaced, the pending tick
                      kept (a retried or concurrent upsert never doubles a
                      tick), and given the new template while it is waiting
                      or delayed (an active one runs as it is; the next tick
                      takes the new template); next '' when the schedule is
                      over
           {1, next, record}  a new or changed schedule: its pending delayed tick
                      job removed (no longer counted against the limit),
                      the first tick produced at next ('' when
                      start/end/limit allow none)
           {-5, id}   the first tick's id collides with an existing job
                      that is not a run of this scheduler: nothing produced
                      (the scheduler is stored and listed, with err; an
                      upsert of the same schedule tries again)
           each then 'unset' when the queue's settings are not stored, or
           another mode than the caller's is (as add.lua's: the Queue
           stores them again; a queue fed by schedulers alone, after the
           server lost its data, is set up again by its upserts)
  Events   removed (prev delayed) for a replaced pending tick; added, then
           delayed or waiting, for the new tick; none for a pending tick
           given the new template (as changePriority and updateJob)
  Slots    every: the first tick at once (or at start), as in BullMQ; when
           an existing schedule changes, one interval from now unless
           immediately. cron: ARGV[10] (now when immediately). A slot
           whose run of this scheduler exists (cancelled before its time,
           promoted and run, under way) is not made twice: the first tick
           is the slot after it.
]]
local lost = not meta()[6] or (ARGV[23] ~= nil and meta()[1] ~= ARGV[23])
local function reply(out)
  if lost then out[#out + 1] = 'unset' end
  return out
end
local sid = ARGV[1]
local skey = base .. 'scheduler:' .. sid
local now = math.floor(now_ms())
local old = redis.call('HMGET', skey, 'spec', 'next', 'err')
-- the same schedule again after its first tick collided (no tick, err): as a new one
local again = old[1] == ARGV[9] and (old[2] or '') == '' and old[3]
for i, name in ipairs(TEMPLATE) do
  local value = ARGV[11 + i]
  if value == '' then redis.call('HDEL', skey, name) else redis.call('HSET', skey, name, value) end
end
if old[1] == ARGV[9] and not again then
  -- the same schedule: the pending tick keeps its id and slot and takes the
  -- new template, unless a worker took it already (a yearly cron would
  -- otherwise run a year later with the old data)
  if old[2] and old[2] ~= '' then
    local pid = tick_id(sid, tonumber(old[2]))
    local jk = job_key(pid)
    local f = redis.call('HMGET', jk, 'state', 'priority', 'lifo', 'pon')
    if (f[1] == 'waiting' or f[1] == 'delayed') and not f[4] then  -- never taken
      for i, name in ipairs(TEMPLATE) do
        local value = ARGV[11 + i]
        if value == '' then redis.call('HDEL', jk, name) else redis.call('HSET', jk, name, value) end
      end
      -- a waiting tick whose priority or lifo changed moves to its new place in line
      local priority, lifo = ARGV[15], ARGV[16]
      if f[1] == 'waiting' and ((f[2] or '') ~= priority or (f[3] or '') ~= lifo) then
        local removed = redis.call('LREM', K_WAIT, '0', pid) + redis.call('ZREM', K_PRIO, pid)
        if removed > 0 then push_ready(pid, tonumber(priority) or 0, lifo == '1') end
      end
    end
  end
  return reply({ 0, old[2] or '', redis.call('HGETALL', skey) })
end

-- a new or changed schedule: the pending tick goes (a waiting or active one
-- runs as usual), the new first tick is produced
if old[2] and old[2] ~= '' then
  local pid = tick_id(sid, tonumber(old[2]))
  if untaken_tick(pid) == 'delayed' then
    redis.call('ZREM', K_DELAYED, pid)
    delete_job(pid, true)
    emit('removed', pid, { 'prev', 'delayed' })
    -- it never ran: it does not count against the limit
    if (tonumber(redis.call('HGET', skey, 'count')) or 0) > 0 then
      redis.call('HINCRBY', skey, 'count', -1)
    end
  end
end
local SPEC = { 'every', 'cron', 'tz', 'start', 'end', 'limit', 'imm' }
for i, name in ipairs(SPEC) do
  local value = ARGV[1 + i]
  if value == '' then redis.call('HDEL', skey, name) else redis.call('HSET', skey, name, value) end
end
redis.call('HSET', skey, 'spec', ARGV[9], 'next', '', 'after', '')
local slot, after
local every = tonumber(ARGV[2])
if every then
  slot = now
  if old[1] and not again and ARGV[8] ~= '1' then slot = now + every end
  local start = tonumber(ARGV[5])
  if start and start > slot then slot = start end
  after = ''
else
  slot, after = tonumber(ARGV[10]), ARGV[11]
end
-- a run of this schedule at that slot (its record kept: cancelled before
-- its time, promoted and run, under way) is not made twice: the first
-- tick is the one after it
if redis.call('HGET', job_key(tick_id(sid, math.floor(slot))), 'sch') == sid then
  if every then
    slot = slot + every
  elseif tonumber(after) then
    slot, after = tonumber(after), ''
  end
end
local id = schedule_tick(sid, math.floor(slot), after, now)
if id == false then
  redis.call('ZADD', K_SCHEDULERS, '+inf', sid)  -- listed, with no next run
  return reply({ -5, tick_id(sid, slot) })
end
if not id then return reply({ 1, '', redis.call('HGETALL', skey) }) end
return reply({ 1, string.format('%d', slot), redis.call('HGETALL', skey) })
