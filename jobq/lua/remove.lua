#!lua flags=allow-oom
--[[
  Remove one job, whatever its state, unless it is active and locked; with
  its children (a flow's, or the jobs it depends on) and theirs, unless
  ARGV[2] is '0'.
  Allowed while the server is out of memory: it frees memory (its events
  are trimmed with the stream, MAXLEN ~).

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  '1': remove its children too (pending, completed, failed and
           ignored ones, at any depth, in whatever queue of the flow);
           '0': detach them (they run on; see delete_job)
  Returns  1 removed; 0 no such job; -2 active with its lock held; a child
           '<queue>:<id>' active with its lock held (nothing is removed)
  Events   removed (prev: the state it was in), per job removed, children
           first
  Dedup    releases each removed job's dedup key, whatever its mode
  Flows    the job, if a child, is dropped from its parent's pending
           children (the parent moves on if it was the last)
  Schedulers  a scheduler's pending tick removed: the next tick is produced
           now, at the schedule's following time
  Cost     O(jobs removed), but for a waiting job one LREM that stops at
           the id (a scan of the wait list from its newest end, in C)
]]
local id = ARGV[1]

-- Remove job `jid` of this queue (its record read: state, sch, slot);
-- `resolved`: its parent is removed in the same call, so not told.
local function remove_one(jid, f, resolved)
  local state = f[1]
  if state == 'waiting' then
    if redis.call('ZREM', K_PRIO, jid) == 0 then redis.call('LREM', K_WAIT, '1', jid) end
  elseif state == 'delayed' then
    redis.call('ZREM', K_DELAYED, jid)
  elseif state == 'active' then
    redis.call('ZREM', K_ACTIVE, jid)
  elseif state == 'completed' then
    redis.call('ZREM', K_COMPLETED, jid)
  elseif state == 'failed' then
    redis.call('ZREM', K_FAILED, jid)
  elseif state == 'waiting-children' then
    redis.call('ZREM', base .. 'waiting-children', jid)
  end
  delete_job(jid, true, resolved)
  emit('removed', jid, { 'prev', state })
  -- a scheduler's pending tick: that run is skipped, the next comes at its time
  if f[2] and f[3] and (state == 'waiting' or state == 'delayed') then
    advance_scheduler(f[2], f[3], now_ms())
  end
end

local function record(jid)
  return redis.call('HMGET', job_key(jid), 'state', 'sch', 'slot', 'kids')
end

local function locked(jid, state)
  return state == 'active' and redis.call('EXISTS', lock_key(jid)) == 1
end

local f = record(id)
if not f[1] then return 0 end
if locked(id, f[1]) then return -2 end

-- The whole tree under the job, breadth first: { base, id, record } per
-- job, the job itself first. A child is named '<queue>:<id>' in its
-- parent's keys, and a queue name may hold ':'; of the ways to split a
-- name, the one whose job names this parent (pid, pqb) is the child.
local tree = { { base, id, f } }
local seen = { [job_key(id)] = true }  -- by key: one entry per job
if ARGV[2] == '1' and f[4] then
  local prefix = string.match(base, '^(.*){[^{}]*}:$')
  local own_slot = nil
  local i = 1
  while tree[i] do
    local pb, pid, pf = tree[i][1], tree[i][2], tree[i][3]
    if pf[4] then
      -- (HGETALL, not HKEYS: the commands the documented ACL lines grant)
      local members = in_queue(pb, function()
        local all = redis.call('SMEMBERS', base .. 'deps:' .. pid)
        for _, k in ipairs({ 'processed:', 'ignored:' }) do
          local flat = redis.call('HGETALL', base .. k .. pid)
          for j = 1, #flat, 2 do all[#all + 1] = flat[j] end
        end
        return all
      end)
      for _, m in ipairs(members) do
        local splits = {}
        local at = string.find(m, ':', 1, true)
        while at do
          local q = string.sub(m, 1, at - 1)
          if not string.find(q, '[{}]') then splits[#splits + 1] = at end
          at = string.find(m, ':', at + 1, true)
        end
        for _, s in ipairs(splits) do
          local cb = prefix .. '{' .. string.sub(m, 1, s - 1) .. '}:'
          local cid = string.sub(m, s + 1)
          -- on a cluster, a key of another slot than the call's may not be
          -- read: with more than one way to split, those are left out (the
          -- child shares its parent's slot)
          if #splits > 1 then
            own_slot = own_slot or key_slot(base)
            if key_slot(cb) ~= own_slot then cb = nil end
          end
          if cb then
            local cf = in_queue(cb, function()
              local r = record(cid)
              local p = redis.call('HMGET', job_key(cid), 'pid', 'pqb')
              if not r[1] or p[1] ~= pid or p[2] ~= pb then return nil end
              if locked(cid, r[1]) then return false end
              return r
            end)
            if cf == false then return m end
            if cf then
              if not seen[cb .. 'job:' .. cid] then
                seen[cb .. 'job:' .. cid] = true
                tree[#tree + 1] = { cb, cid, cf }
              end
              break
            end
          end
        end
      end
    end
    i = i + 1
  end
end

for j = #tree, 2, -1 do
  in_queue(tree[j][1], remove_one, tree[j][2], tree[j][3], true)
end
remove_one(id, f, false)
return 1
