#!lua
--[[
  Move finished jobs back to waiting. They keep attempts_made, the stall
  count and the stack traces of the attempts they count (as BullMQ does), so
  a job that used up its attempts gets one more; asked to reset, they start
  with a fresh set of attempts.

  KEYS[1]  queue base prefix
  ARGV[1]  state the jobs must be in: failed | completed
  ARGV[2]  batch size (when no ids are given)
  ARGV[3]  '1' resets attempts_made, the stall count and the stack traces;
           '0' keeps them
  ARGV[4..] job ids; none: the oldest jobs of that state, a batch
  Returns  {number of jobs moved, the last one's new run token}; -1 when a
           given id does not exist, -3 when it is not in that state (nothing
           is moved then)
  Events   waiting (prev: the state) per job, or waiting-children for a
           parent whose children are not all done (one failed it while
           others still ran: it waits for them again), then failed again
           for a parent that a child still failed fails
           (fail_parent_on_failure: retry that child); waiting-children
           (prev failed) for a parent that failed by a retried child and
           waits on it again (and for its own parent, up a chain)

  A retry begins the next generation of the job's run: its token becomes
  the run's first token, '#' and the number of retries (see getOutcome.lua),
  so that a wait for the retried job is never answered by the outcome that
  ended it before, and a wait for an earlier generation takes a later one.
]]
local state = ARGV[1]
local set = base .. state
local reset = ARGV[3] == '1'
local now = now_ms()
local ids = {}
local run = ''
if #ARGV > 3 then
  for i = 4, #ARGV do
    if redis.call('EXISTS', job_key(ARGV[i])) == 0 then return -1 end
    if not redis.call('ZSCORE', set, ARGV[i]) then return -3 end
    ids[#ids + 1] = ARGV[i]
  end
else
  ids = redis.call('ZRANGE', set, '0', tonumber(ARGV[2]) - 1)
end
local function retry_one(id)
  local jk = job_key(id)
  local f = redis.call('HMGET', jk, 'priority', 'lifo', 'run', 'pid', 'pqb', 'kids', 'ts')
  local first, gen = string.match(f[3] or '', '^(.*)#(%d+)$')
  if not first then first, gen = f[3] or '', 0 end
  run = first .. '#' .. (tonumber(gen) + 1)
  -- (cx: a cancel ends the run it cancelled, not the runs a retry begins)
  redis.call('HDEL', jk, 'fr', 'et', 'rv', 'fon', 'ftok', 'pon', 'pb', 'tok', 'cx', 'fchild')
  if reset then redis.call('HDEL', jk, 'atm', 'stc', 'st') end
  if f[6] and redis.call('SCARD', base .. 'deps:' .. id) > 0 then
    -- a parent with children not all done (pending, or failed and not
    -- retried yet): it waits for them again, as before it failed
    redis.call('HSET', jk, 'state', 'waiting-children', 'run', run)
    redis.call('ZADD', base .. 'waiting-children', f[7] or fmt(now), id)
    emit('waiting-children', id, { 'prev', state })
    local culprit = failed_culprit(id, nil)
    if culprit then  -- a child that fails it is still failed: it fails again
      redis.call('ZREM', base .. 'waiting-children', id)
      fail_by_child(id, culprit, 'waiting-children', now)
      return
    end
  else
    redis.call('HSET', jk, 'state', 'waiting', 'rdy', now, 'run', run)
    push_ready(id, tonumber(f[1]) or 0, f[2] == '1')
    emit('waiting', id, { 'prev', state })
  end
  -- a child: its parent waits on it again (and one failed by it, too)
  if f[4] then notify_parent(id, f[4], f[5], 'retried', '', '', now) end
end

local moved = 0
for _, id in ipairs(ids) do
  -- a child retried before may have reopened its parent, listed too
  if redis.call('ZREM', set, id) == 1 then
    retry_one(id)
    moved = moved + 1
  end
end
return { moved, run }
