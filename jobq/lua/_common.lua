--[[
  Helpers shared by the scripts. All scripts make one library of functions
  (scripts.py), loaded once per server: the helpers below are defined once,
  when it loads. Every other top-level value (a line "local NAME = ...")
  is assigned at the start of each call, in the order written, unless it
  is a constant (an upper-case name whose value uses neither KEYS, ARGV,
  base nor a K_ key), which is set once; base and the upper-case keys
  derived from it alone are assigned only when KEYS[1] is not the last
  call's. Each script's body runs with KEYS and ARGV as in a script.

  KEYS[1] is always the queue's base prefix
  "<prefix>:{<queue>}:", and every other key is derived from it, so all keys
  of a queue share its hash tag (one cluster slot). KEYS[2] is a guard key
  of the same slot that is never written: declaring two keys that do not
  exist makes a cluster answer TRYAGAIN while the slot migrates, instead of
  running the script against half-moved keys (see scripts.py).

  Numbers are passed to redis.call as Lua numbers (formatted with %.17g),
  never through tostring(), which would round them to 14 digits.
]]
local base = KEYS[1]
local K_WAIT = base .. 'wait'
local K_PRIO = base .. 'prioritized'
local K_DELAYED = base .. 'delayed'
local K_ACTIVE = base .. 'active'
local K_COMPLETED = base .. 'completed'
local K_FAILED = base .. 'failed'
local K_META = base .. 'meta'
local K_EVENTS = base .. 'events'
local K_MARKER = base .. 'marker'

-- The server's clock in ms, read once per call: a call is atomic, so one
-- reading serves every job it touches.
local _now = nil
local function now_ms()
  if not _now then
    local t = redis.call('TIME')
    _now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
  end
  return _now
end

-- A number as redis.call would send it (%.17g), formatted once per call:
-- the same clock reading is written several times by one call, and each
-- formatting of a fraction costs the server a few thousand instructions.
local _formatted = {}
local function fmt(n)
  local s = _formatted[n]
  if not s then
    s = string.format('%.17g', n)
    _formatted[n] = s
  end
  return s
end

-- A whole number as text: far cheaper for the server than the %.17g that
-- redis.call applies to a Lua number.
local function int(n) return string.format('%d', n) end

local function append(list, more)
  for i = 1, #more do list[#list + 1] = more[i] end
  return list
end

local function job_key(id) return base .. 'job:' .. id end
local function lock_key(id) return base .. 'lock:' .. id end

-- The queue's settings, read once per call: event mode, stream length, the
-- paused flag (no script both pauses and reads it), the result TTL in ms,
-- the shard mark, whether a Queue stored its settings (field cfg, which a
-- server that lost its data no longer has: see add.lua), and in pub/sub
-- mode the number of the queue's database (field db, see
-- storeSettings.lua; false when none is stored), and whether its pub/sub
-- events are published with SPUBLISH (see publish_event).
local _meta = nil
local function meta()
  if not _meta then
    local m = redis.call('HMGET', K_META, 'em', 'maxev', 'paused', 'rttl', 'shard', 'cfg', 'db',
      'sp')
    _meta = { m[1] or 'stream', m[2] and string.match(m[2], '^%d+$') or '10000', m[3] == '1',
      tonumber(m[4]) or 60000, m[5] == '1', m[6] and true or false, m[7],
      m[5] == '1' or m[8] == '1' }
  end
  return _meta
end

-- Whether the queue holds jobs or schedulers: a name a plain queue uses,
-- which a sharded queue must not take over (see storeShardCount.lua and
-- storeSettings.lua).
local function holds_jobs()
  for _, key in ipairs({ K_WAIT, K_PRIO, K_DELAYED, K_ACTIVE, K_COMPLETED, K_FAILED,
      base .. 'waiting-children', base .. 'schedulers' }) do
    if redis.call('EXISTS', key) == 1 then return true end
  end
  return false
end

-- Publish a pub/sub event message on the queue's events channel: with
-- SPUBLISH for a shard and in a cluster (field sp: the queue's own node
-- serves the channel), else with PUBLISH, which 0.1 processes subscribe to
-- (they hear 0.2's events, and 0.2 hears theirs).
local function publish_event(message)
  if meta()[8] then
    redis.call('SPUBLISH', K_EVENTS, message)
  else
    redis.call('PUBLISH', K_EVENTS, message)
  end
end

-- Encode a flat list as netstrings ("<len>:<bytes>"), for pub/sub messages.
local function netstrings(parts)
  local out = {}
  for i = 1, #parts do
    local s = parts[i]
    if type(s) == 'number' then s = string.format('%.17g', s) end
    out[i] = string.len(s) .. ':' .. s
  end
  return table.concat(out)
end

-- The run token of each job deleted by this call (see delete_job), for the
-- events written after the record is gone.
local _runs = {}

-- The wake-up a shard publishes on its events channel after writing to its
-- stream, once per call: a pub/sub reader's checkpoint message that no
-- waiter waits for (netstrings of ev, the checkpoint name, jid, "wake").
local WAKE_READERS = '2:ev19:__jobq_checkpoint__3:jid4:wake'
local _told = false

-- Events that end a run of a job: they carry the run's token, so that a
-- waiter never takes the outcome of an earlier or later run of the same id.
local RUN_ENDS = { completed = true, failed = true, removed = true }

-- Write one event: name, job id (or false) and a flat field/value list.
-- Returns the stream entry's id ('' in pub/sub mode). An `added` event
-- starts a run of the job: its token (the entry's id; in pub/sub mode 'p'
-- and a counter that obliterate keeps) is recorded as the job's `run` field
-- and returned instead; with `own_record` the caller writes that field
-- itself (in the same HSET as the rest of the record).
-- `then_name`: a second event of the same job, with no fields, written in
-- the same stream entry as field ev:2 (readers expand an entry's second
-- event, whose fields carry the suffix ':2', after its first): an add is
-- one entry for `added` and `waiting`, not two.
local function emit(name, jid, fields, then_name, own_record)
  local m = meta()
  if jid and RUN_ENDS[name] then
    local run = _runs[jid] or redis.call('HGET', job_key(jid), 'run')
    if run then
      fields[#fields + 1] = 'run'
      fields[#fields + 1] = run
    end
  end
  local id = ''
  if m[1] == 'pubsub' then
    -- a channel's name has no database in it: db tells the readers of
    -- this database's queue from those of its namesakes in other ones. It
    -- is always the last field ('' when not stored), so that a custom
    -- event's own field db (before it) is never taken for it
    local parts = { 'ev', name, 'jid', jid or '', 'ts', now_ms() }
    for i = 1, #fields do parts[#parts + 1] = fields[i] end
    append(parts, { 'db', m[7] or '' })
    publish_event(netstrings(parts))
    if then_name then
      local more = { 'ev', then_name, 'jid', jid, 'ts', now_ms() }
      append(more, { 'db', m[7] or '' })
      publish_event(netstrings(more))
    end
    if name == 'added' then id = 'p' .. redis.call('INCR', base .. 'runs') end
  else
    if then_name then
      fields[#fields + 1] = 'ev:2'
      fields[#fields + 1] = then_name
    end
    id = redis.call('XADD', K_EVENTS, 'MAXLEN', '~', m[2], '*', 'ev', name, 'jid', jid or '',
      unpack(fields))
    if m[5] and not _told then
      -- a shard: wake the readers of the sharded queue, which listen to
      -- every shard of a node on one connection (jobq/_shard_reader.py)
      redis.call('SPUBLISH', K_EVENTS, WAKE_READERS)
      _told = true
    end
  end
  if name == 'added' and not own_record then redis.call('HSET', job_key(jid), 'run', id) end
  return id
end

-- What the take of this call found (emit_if_drained reads it): a job taken
-- (it is active, so the queue is not drained), or nothing waiting at all
-- (until a job is made ready again in the same call).
local _took, _none_waiting = false, false

-- Wake blocked workers (their BZPOPMIN on the marker), once per call. A
-- shard of a sharded queue (meta field shard) also publishes on the sharded
-- channel named as its marker: a worker of the sharded queue listens to all
-- of a node's shards on one connection (see jobq/_shard_fetcher.py).
local _marked = false
local function mark_ready()
  if not _marked then
    redis.call('ZADD', K_MARKER, '0', '0')
    if meta()[5] then redis.call('SPUBLISH', K_MARKER, '1') end
    _marked = true
  end
end

-- Wake blocked workers to look again when a delayed job is due at `run_at`
-- (ms): the marker's score is the earliest such time.
local function mark_due(run_at)
  redis.call('ZADD', K_MARKER, 'LT', run_at, '1')
  if meta()[5] then redis.call('SPUBLISH', K_MARKER, '1') end
end

-- Put job `id` in the delayed set, due at `run_at` (ms), and wake blocked
-- workers then. Delayed jobs due at the same moment keep the order they
-- were added in: each is scored the next larger double after the scores
-- already taken at that moment (a quarter of a microsecond apart at
-- today's epoch times), by jobs of this call or of earlier ones, never tied
-- with one, as the sorted set would order ties by id string ("1", "10",
-- "2"). `_ties` keeps, per delayed set and due time, the next score to try
-- in this call (in_queue keeps it across queues), so that a bulk add looks
-- at each score once.
local _ties = {}
local function add_delayed(id, run_at)
  local tie = K_DELAYED .. ' ' .. fmt(run_at)
  local score = _ties[tie] or run_at
  -- ZRANGEBYSCORE, not ZCOUNT: the documented ACL lines allow it already
  while #redis.call('ZRANGEBYSCORE', K_DELAYED, fmt(score), fmt(score), 'LIMIT', 0, 1) > 0 do
    local _, e = math.frexp(score)
    score = score + math.ldexp(1, e - 53)
  end
  local _, e = math.frexp(score)
  _ties[tie] = score + math.ldexp(1, e - 53)
  redis.call('ZADD', K_DELAYED, fmt(score), id)
  mark_due(score)
end

-- Make a job ready to run: prioritized jobs in the sorted set, others in the
-- wait list (taken from its right end; `front` puts the job next in line).
local function push_ready(id, priority, front)
  if priority > 0 then
    local seq = redis.call('INCR', base .. 'pc')
    if seq >= 2147483647 then redis.call('SET', base .. 'pc', '0') end
    local offset
    if front then offset = 2147483648 - seq else offset = 2147483648 + seq end
    redis.call('ZADD', K_PRIO, priority * 4294967296 + offset, id)
  elseif front then
    redis.call('RPUSH', K_WAIT, id)
  else
    redis.call('LPUSH', K_WAIT, id)
  end
  _none_waiting = false
  mark_ready()
end

-- Make plain jobs (no priority, not lifo) ready, in order, as push_ready
-- would one by one: one LPUSH per 1000 ids, not one per job (a bulk add).
local function push_waiting(ids)
  if #ids == 0 then return end
  for i = 1, #ids, 1000 do
    redis.call('LPUSH', K_WAIT, unpack(ids, i, math.min(i + 999, #ids)))
  end
  _none_waiting = false
  mark_ready()
end

-- Tell the parent of job `id` (of this queue) that the job ended (see
-- "Flows" below; defined there).
local notify_parent

-- The keys a parent keeps about its children (see "Flows" below).
local PARENT_KEYS = { 'deps:', 'processed:', 'ignored:', 'dfailed:' }

-- Release the dedup key a job holds (fields ddk, its key, and ddt, set for
-- a throttle key with a ttl): the key stores its owner's id, so a key taken
-- over by a newer job is left alone. `always`: a throttle key too (the job
-- is removed or cancelled); else only a simple one (the job finished).
local function release_dedup(id, ddk, ddt, always)
  if ddk and (always or not ddt) then
    local key = base .. 'dedup:' .. ddk
    if redis.call('GET', key) == id then redis.call('DEL', key) end
  end
end

-- Delete a job's record, logs and lock.
-- `removed`: the job is removed (by remove, drain, clean, obliterate or its
-- scheduler), so the dedup key it owns goes too, whatever its mode; a job
-- dropped by a retention rule released its simple key when it finished,
-- and a throttle key keeps throttling until its ttl.
-- A child is dropped from its parent's pending children (the parent moves
-- on if it was the last) unless `resolved` (its end was told already, or it
-- completed); a parent's children are detached: they run on, and their
-- outcome goes nowhere.
local function delete_job(id, removed, resolved)
  local f = redis.call('HMGET', job_key(id), 'run', 'pid', 'pqb', 'kids', 'state', 'ddk', 'ddt')
  if f[1] then _runs[id] = f[1] end
  if removed then release_dedup(id, f[6], f[7], true) end
  redis.call('DEL', job_key(id), base .. 'logs:' .. id, lock_key(id))
  if f[4] then
    for _, k in ipairs(PARENT_KEYS) do redis.call('DEL', base .. k .. id) end
    if f[5] == 'waiting-children' then redis.call('ZREM', base .. 'waiting-children', id) end
  end
  if f[2] and not resolved and f[5] ~= 'completed' then
    notify_parent(id, f[2], f[3], 'removed', '', '', now_ms())
  end
end

-- Add a finished job to its set (scored by the whole ms: a small sorted
-- set keeps whole scores as integers, where it parses a fraction from text
-- for every score an insert passes) and apply a retention rule:
-- count < 0 keeps all, count > 0 keeps the newest `count`; age_ms > 0 also
-- removes jobs finished more than age_ms ago. Removes at most 1000 per call.
local function retain(set, id, finished, count, age_ms)
  redis.call('ZADD', set, int(math.floor(finished)), id)
  if age_ms > 0 then
    local old = redis.call('ZRANGEBYSCORE', set, '-inf', finished - age_ms, 'LIMIT', '0', '1000')
    for _, oid in ipairs(old) do
      delete_job(oid)
      redis.call('ZREM', set, oid)
    end
  end
  if count > 0 then
    local excess = redis.call('ZCARD', set) - count
    if excess > 0 then
      if excess > 1000 then excess = 1000 end
      local old = redis.call('ZRANGE', set, '0', excess - 1)
      for _, oid in ipairs(old) do delete_job(oid) end
      redis.call('ZREMRANGEBYRANK', set, '0', excess - 1)
    end
  end
end

-- Whether `token` owns the active job: it holds the lock, or the lock just
-- expired and nobody has taken the job over yet.
local function owns(id, token)
  local cur = redis.call('GET', lock_key(id))
  if cur then return cur == token end
  local f = redis.call('HMGET', job_key(id), 'tok', 'state')
  return f[1] == token and f[2] == 'active'
end

-- Per-minute metrics of finished jobs, one hash per kind ('completed',
-- 'failed') with totals (count; wait and run, ms), the minute being counted
-- (min) and the count at its start (mbase); finished minutes go to the list
-- <hash>:data, newest first, at most METRICS_MINUTES long. One HMGET and one
-- HSET per job; one more LPUSH + LTRIM when the minute changes.
local METRICS_MINUTES = 1440
local function record_metric(kind, now, waited, ran)
  local key = base .. 'metrics:' .. kind
  local minute = math.floor(now / 60000)
  local m = redis.call('HMGET', key, 'min', 'mbase', 'count', 'wait', 'run')
  local last = tonumber(m[1])
  local count = tonumber(m[3]) or 0
  local mbase = tonumber(m[2]) or 0
  if not last or minute > last then
    if last then
      local counts = { count - mbase }
      for i = 2, math.min(minute - last, METRICS_MINUTES) do counts[i] = 0 end
      redis.call('LPUSH', key .. ':data', unpack(counts))
      redis.call('LTRIM', key .. ':data', '0', METRICS_MINUTES - 1)
    end
    redis.call('HSET', key, 'min', int(minute), 'mbase', int(count))  -- a new minute
  end
  redis.call('HSET', key, 'count', int(count + 1),
    'wait', int((tonumber(m[4]) or 0) + math.floor(waited + 0.5)),
    'run', int((tonumber(m[5]) or 0) + math.floor(ran + 0.5)))
end

-- A finished attempt's metrics: counted in the per-minute metrics of `kind`
-- (record_metric), and returned as the fields of its event. The record's
-- times (pon, rdy) are read once for both.
local function finish_metrics(kind, f_pon, f_rdy, f_delay, attempt, now)
  local pon = tonumber(f_pon) or now
  local rdy = tonumber(f_rdy) or pon
  local waited, ran = math.max(0, pon - rdy), math.max(0, now - pon)
  record_metric(kind, now, waited, ran)
  return { 'attempt', int(attempt), 'waited_for', waited, 'ran_for', ran,
           'expected_delay', f_delay or '0' }
end

-- Fail a job for good (its lock and active entry already gone): record it
-- in the failed set under its retention rule and emit `failed`. `prev` is
-- the state it leaves (default active); `cancelled` adds the field
-- cancelled=1 to the event (waiters raise JobCancelledError); `exc_type` is
-- the exception's type name, written as `exc_type` when given.
local function fail_for_good(id, reason, attempt, now, prev, cancelled, exc_type)
  local jk = job_key(id)
  local f = redis.call('HMGET', jk, 'pon', 'rdy', 'delay', 'kfc', 'kfa', 'run', 'ddk', 'ddt',
    'pid', 'pqb', 'fpol', 'fchild')
  if f[6] then _runs[id] = f[6] end
  release_dedup(id, f[7], f[8], cancelled)
  local fields = { 'prev', prev or 'active', 'failed_reason', reason }
  if exc_type and exc_type ~= '' then append(fields, { 'exc_type', exc_type }) end
  append(fields, finish_metrics('failed', f[1], f[2], f[3], attempt, now))
  if cancelled then append(fields, { 'cancelled', '1' }) end
  local keep = tonumber(f[4]) or -1
  if keep == 0 then
    delete_job(id, false, true)
    if f[6] then  -- the outcome outlives the record a while (see getOutcome)
      redis.call('SET', base .. 'failure:' .. f[6], (cancelled and 'cancelled' or 'failed')
        .. '\n' .. (exc_type or '') .. '\n' .. reason, 'PX', meta()[4])
    end
  else
    redis.call('HSET', jk, 'state', 'failed', 'fon', fmt(now), 'fr', reason)
    if not exc_type or exc_type == '' then redis.call('HDEL', jk, 'et') end
    retain(K_FAILED, id, now, keep, tonumber(f[5]) or 0)
  end
  emit('failed', id, fields)
  if f[9] then  -- a child: its failure policy first, then its removal
    -- failed by a child of its own ('child <key> failed: <cause>'): the
    -- cause alone goes up, so each level names its child and the first
    -- cause (nested, a chain of n steps wrote reasons of n levels each:
    -- time and memory growing as n squared)
    local told = f[12] and string.match(reason, '^child %S+ failed: (.*)$') or reason
    notify_parent(id, f[9], f[10], 'failed', told, f[11] or '', now)
    if keep == 0 then notify_parent(id, f[9], f[10], 'removed', '', '', now) end
  end
end

-- Flows. A child names its parent in its record: pid (the parent's id) and
-- pqb (the base of the parent's queue, which may be another queue of the
-- same prefix); fpol is its failure policy ('f' fail the parent, 'i'
-- ignore the failure, 'r' remove the dependency; absent: the parent keeps
-- waiting on it). A parent (field kids) waits in state waiting-children,
-- listed in its queue's waiting-children set; deps:<id> holds its pending
-- children as '<queue>:<id>', processed:<id> the result of each completed
-- one, ignored:<id> the reason of each failure ignored, dfailed:<id> the
-- reason of each failed child it still waits on (default policy). Every
-- change to these happens in the script that changes the child.

-- The queue name in a queue's base ("<prefix>:{<queue>}:").
local function queue_of(b) return string.match(b, '{([^{}]*)}:$') end

-- The cluster slot of a key: CRC16 (XMODEM) of its hash tag (the first
-- non-empty {...}) or of the whole key, modulo 16384.
local function key_slot(key)
  local s = string.find(key, '{', 1, true)
  if s then
    local e = string.find(key, '}', s + 1, true)
    if e and e > s + 1 then key = string.sub(key, s + 1, e - 1) end
  end
  local crc = 0
  for i = 1, #key do
    crc = bit.bxor(crc, bit.lshift(string.byte(key, i), 8))
    for _ = 1, 8 do
      crc = bit.lshift(crc, 1)
      if bit.band(crc, 0x10000) ~= 0 then crc = bit.bxor(crc, 0x1021) end
      crc = bit.band(crc, 0xffff)
    end
  end
  return crc % 16384
end

-- The parents still to be told in this call (see notify_parent), or nil.
local _telling = nil

-- Run fn(...) with the keys of the queue whose base is `target` (a parent's
-- or a child's queue), then return to the caller's queue: its keys and its
-- per-call state (run tokens of deleted jobs, the ready mark, settings,
-- the delayed scores given).
-- On a cluster the queues of one flow share a slot (FlowProducer checks).
local function in_queue(target, fn, ...)
  if target == base then return fn(...) end
  local keys, runs, marked, settings, told, ties = KEYS, _runs, _marked, _meta, _told, _ties
  local telling = _telling
  KEYS = { target, target .. 'slot-guard' }
  _per_call()
  _ties = ties  -- one for the whole call: it is keyed by each queue's delayed set
  _telling = telling  -- one for the whole call too (see notify_parent)
  local r = fn(...)
  KEYS = keys
  _per_call()
  _runs, _marked, _meta, _told, _ties, _telling = runs, marked, settings, told, ties, telling
  return r
end

-- A parent of this queue whose last child ended moves on, once: to
-- waiting, or delayed by its own delay counted from now. Emits waiting (or
-- delayed) with prev waiting-children.
local function release_parent(pid, now)
  local jk = job_key(pid)
  local f = redis.call('HMGET', jk, 'state', 'delay', 'priority', 'lifo')
  if f[1] ~= 'waiting-children' then return end
  redis.call('ZREM', base .. 'waiting-children', pid)
  local delay = tonumber(f[2]) or 0
  if delay > 0 then
    local run_at = now + delay
    add_delayed(pid, run_at)
    redis.call('HSET', jk, 'state', 'delayed', 'rdy', fmt(run_at), 'rel', fmt(now))
    emit('delayed', pid, { 'delay', delay, 'run_at', run_at, 'prev', 'waiting-children' })
  else
    push_ready(pid, tonumber(f[3]) or 0, f[4] == '1')
    redis.call('HSET', jk, 'state', 'waiting', 'rdy', fmt(now), 'rel', fmt(now))
    emit('waiting', pid, { 'prev', 'waiting-children' })
  end
end

-- A child of parent `pid` (not `except`) that failed with policy 'f' and
-- is still failed (listed in the parent's field ffs, and in dfailed), or
-- nil: while there is one, the parent is failed.
local function failed_culprit(pid, except)
  local ffs = redis.call('HGET', job_key(pid), 'ffs')
  for m in string.gmatch(ffs or '', '%S+') do
    if m ~= except and redis.call('HEXISTS', base .. 'dfailed:' .. pid, m) == 1 then return m end
  end
  return nil
end

-- Fail parent `pid` for good by its child `m` (policy 'f'), from `prev`.
local function fail_by_child(pid, m, prev, now)
  local jk = job_key(pid)
  local reason = redis.call('HGET', base .. 'dfailed:' .. pid, m) or ''
  redis.call('HSET', jk, 'fchild', m)
  fail_for_good(pid, 'child ' .. m .. ' failed: ' .. reason,
    tonumber(redis.call('HGET', jk, 'atm')) or 0, now, prev)
end

-- Child `m` ('<queue>:<id>') of parent `pid` of this queue ended: `kind`
-- completed (value: its result), failed (value: its reason; policy: its
-- fpol), removed, or retried (it runs again).
-- A failed child with the default policy or 'f' stays pending, its reason
-- in dfailed: the parent never runs without it; with 'f' (listed in the
-- parent's ffs) the parent is failed by it while it is failed. A retried
-- child is pending again (no longer in dfailed or processed); a parent
-- that failed by it waits again, unless another 'f' child is still failed
-- (then failed by that one), and tells its own parent so (a chain reopens
-- step by step). Only a child the parent knows (pending, processed or
-- ignored) counts: a detached child of a removed parent is not taken in
-- by a new parent of the same id.
local function child_ended(pid, m, kind, value, policy, now)
  local dk = base .. 'deps:' .. pid
  if kind == 'retried' then
    local jk = job_key(pid)
    local f = redis.call('HMGET', jk, 'state', 'fchild', 'run', 'ts', 'pid', 'pqb')
    -- (fchild: a parent failed by a child before failed children stayed
    -- pending, written by an earlier release)
    if f[2] ~= m and redis.call('SISMEMBER', dk, m) == 0
        and redis.call('HEXISTS', base .. 'processed:' .. pid, m) == 0
        and redis.call('HEXISTS', base .. 'ignored:' .. pid, m) == 0 then
      return
    end
    if f[1] ~= 'waiting-children' and f[1] ~= 'failed' then return end  -- it moved on
    redis.call('SADD', dk, m)
    redis.call('HDEL', base .. 'dfailed:' .. pid, m)
    redis.call('HDEL', base .. 'ignored:' .. pid, m)
    redis.call('HDEL', base .. 'processed:' .. pid, m)  -- a completed one runs again
    if f[1] == 'failed' and f[2] == m then  -- it failed by this child
      local other = failed_culprit(pid, m)
      if other then  -- failed by another still: its reason now
        redis.call('HSET', jk, 'fchild', other, 'fr', 'child ' .. other .. ' failed: ' ..
          (redis.call('HGET', base .. 'dfailed:' .. pid, other) or ''))
        return
      end
      -- it waits again
      local first, gen = string.match(f[3] or '', '^(.*)#(%d+)$')
      if not first then first, gen = f[3] or '', 0 end
      redis.call('ZREM', K_FAILED, pid)
      redis.call('HDEL', jk, 'fchild', 'fr', 'fon', 'ftok', 'et')
      redis.call('HSET', jk, 'state', 'waiting-children', 'run', first .. '#' .. (tonumber(gen) + 1))
      redis.call('ZADD', base .. 'waiting-children', f[4] or fmt(now), pid)
      emit('waiting-children', pid, { 'prev', 'failed' })
      if f[5] then notify_parent(pid, f[5], f[6], 'retried', '', '', now) end
    end
    return
  end
  if kind == 'failed' and (policy == '' or policy == 'f') then
    if redis.call('SISMEMBER', dk, m) == 0 then return end  -- not pending: told before
    redis.call('HSET', base .. 'dfailed:' .. pid, m, value)
    if policy == 'f' then
      local jk = job_key(pid)
      local f = redis.call('HMGET', jk, 'state', 'ffs')
      if not string.find(' ' .. (f[2] or '') .. ' ', ' ' .. m .. ' ', 1, true) then
        redis.call('HSET', jk, 'ffs', f[2] and (f[2] .. ' ' .. m) or m)
      end
      if f[1] == 'waiting-children' then
        redis.call('ZREM', base .. 'waiting-children', pid)
        fail_by_child(pid, m, 'waiting-children', now)
      end
    end
    return
  end
  if redis.call('SREM', dk, m) == 0 then return end  -- not pending: told before
  redis.call('HDEL', base .. 'dfailed:' .. pid, m)
  if kind == 'completed' then
    redis.call('HSET', base .. 'processed:' .. pid, m, value)
  elseif kind == 'failed' and policy == 'i' then
    redis.call('HSET', base .. 'ignored:' .. pid, m, value)
  end
  if redis.call('SCARD', dk) == 0 then release_parent(pid, now) end
end

-- A parent told may tell its own parent (a failure or a reopening going up
-- a chain, one level per call): such a call made while another is told is
-- queued (in _telling), and the first call tells them all in turn, so a
-- chain of any length takes no deeper a Lua stack (a chain of 10,000 steps
-- overflowed it, its failure left half-written).
function notify_parent(id, pid, pqb, kind, value, policy, now)
  local told = { pqb, pid, queue_of(base) .. ':' .. id, kind, value, policy, now }
  if _telling then
    _telling[#_telling + 1] = told
    return
  end
  _telling = { told }
  local i = 1
  while _telling[i] do
    local t = _telling[i]
    in_queue(t[1], child_ended, t[2], t[3], t[4], t[5], t[6], t[7])
    i = i + 1
  end
  _telling = nil
end

-- End the attempt of an active job whose cancel was requested (its `cx`
-- field holds the reason): whatever the handler did, the attempt counts and
-- the job fails for good with the reason. complete.lua and fail.lua call it
-- once the token is known to own the job; they return code 3.
local function end_cancelled(id, token, reason, now)
  local jk = job_key(id)
  local atm = (tonumber(redis.call('HGET', jk, 'atm')) or 0) + 1
  redis.call('DEL', lock_key(id))
  redis.call('ZREM', K_ACTIVE, id)
  redis.call('HSET', jk, 'atm', atm, 'fr', reason, 'ftok', token)
  fail_for_good(id, reason, atm, now, 'active', true)
end

-- The return code of a finalising script called without owning the job:
-- 0 when this token finalised it already (a retried call), -1 when the job
-- is gone, -2 when another worker holds it; nil when the token owns it.
local function not_owner(id, token)
  if owns(id, token) then return nil end
  local f = redis.call('HMGET', job_key(id), 'ftok', 'state')
  if f[1] == token then return 0 end
  if not f[2] then return -1 end
  return -2
end

-- Schedulers. Each has a hash scheduler:<id> (its schedule: every ms or
-- cron and tz, start, end, limit; its job template, TEMPLATE below; count,
-- the jobs produced; next, the slot in ms of its pending tick job, '' once
-- the schedule is over; after, for cron, the slot after next when known,
-- computed in Python; err, a collision to report) and an entry in the
-- sorted set `schedulers` scored by next (+inf when over). A tick job's id
-- is a pure function of (scheduler id, slot), and its record names both
-- (fields sch, slot), so whoever produces a tick twice makes one job.
local K_SCHEDULERS = base .. 'schedulers'
-- (tc: the trace context of the upsert, present only while tracing was on;
-- each tick job keeps it, and its attempts link to it: see jobq/_tracing.py)
local TEMPLATE = { 'name', 'data', 'opts', 'priority', 'lifo', 'atts', 'kc', 'ka', 'kfc', 'kfa',
  'tc' }
local function tick_id(sid, slot) return 'repeat:' .. sid .. ':' .. string.format('%d', slot) end

-- Produce the tick job of scheduler `sid` at `slot` (ms): delayed until
-- then (waiting when due), unless the schedule's end or limit is reached.
-- `after` ('' when unknown) is the slot after it. Returns the job id; nil
-- when the schedule is over; false when a job with the tick's id exists
-- (a kept job of an earlier run: recorded in err, a loud error for upsert
-- and for the workers' check, never a silent skip).
local function schedule_tick(sid, slot, after, now)
  local skey = base .. 'scheduler:' .. sid
  local s = redis.call('HMGET', skey, 'end', 'limit', 'count', unpack(TEMPLATE))
  local count = tonumber(s[3]) or 0
  if (tonumber(s[1]) and slot > tonumber(s[1])) or (tonumber(s[2]) and count >= tonumber(s[2])) then
    redis.call('HSET', skey, 'next', '', 'after', '')
    redis.call('ZADD', K_SCHEDULERS, '+inf', sid)
    return nil
  end
  local id = tick_id(sid, slot)
  local jk = job_key(id)
  if redis.call('EXISTS', jk) == 1 then
    redis.call('HSET', skey, 'err', 'the tick job ' .. id .. ' of scheduler ' .. sid ..
      ' collides with an existing job: remove that job or use another scheduler id')
    return false
  end
  local fields = { 'name', s[4], 'data', s[5], 'opts', s[6], 'ts', now, 'sch', sid,
    'slot', string.format('%d', slot) }
  for i = 4, #TEMPLATE do  -- settings at their default are not stored
    if s[i + 3] then append(fields, { TEMPLATE[i], s[i + 3] }) end
  end
  -- but the priority always is: a tick is delayed (see add.lua)
  if not s[7] then append(fields, { 'priority', '0' }) end
  local delay = math.max(0, slot - now)
  if delay > 0 then
    append(fields, { 'state', 'delayed', 'rdy', slot, 'delay', delay })
  else
    append(fields, { 'state', 'waiting', 'rdy', now })
  end
  redis.call('HSET', jk, unpack(fields))
  local priority = tonumber(s[7]) or 0
  emit('added', id, { 'job_name', s[4], 'delay', delay, 'priority', priority })
  if delay > 0 then
    redis.call('ZADD', K_DELAYED, slot, id)
    mark_due(slot)
    emit('delayed', id, { 'delay', delay, 'run_at', slot })
  else
    push_ready(id, priority, s[8] == '1')
    emit('waiting', id, {})
  end
  redis.call('HSET', skey, 'next', string.format('%d', slot), 'after', after, 'count', count + 1)
  redis.call('HDEL', skey, 'err')
  redis.call('ZADD', K_SCHEDULERS, slot, sid)
  return id
end

-- The state of tick job `id` while no worker ever took it (nil once taken:
-- a taken tick failed into a retry's backoff, or stalled, is delayed or
-- waiting again, but it is a run under way, not the scheduler's pending
-- tick: never removed with a schedule, never holding the next run back).
local function untaken_tick(id)
  local f = redis.call('HMGET', job_key(id), 'state', 'pon')
  if f[2] then return nil end
  return f[1]
end

-- The first slot of an `every` schedule after `now`, on the grid of the
-- previous scheduled slot `prev`: ticks missed while no worker ran make one
-- job (the one due), not a burst.
local function every_after(prev, every, now)
  return prev + every * math.max(1, math.floor((now - prev) / every) + 1)
end

-- A tick job of scheduler `sid` at `slot` was taken: produce the next tick
-- in the same call (every: computed here; cron: the `after` slot Python
-- computed, when it is known and still ahead; else the workers' check
-- produces it). Does nothing when the scheduler moved on (removed, upserted
-- with another schedule, or advanced already by an earlier take).
local function advance_scheduler(sid, slot, now)
  local s = redis.call('HMGET', base .. 'scheduler:' .. sid, 'next', 'every', 'after')
  if not s[1] or s[1] ~= slot then return end
  local every, after = tonumber(s[2]), tonumber(s[3])
  local nxt
  if every then
    nxt = every_after(tonumber(slot), every, now)
  elseif after and after > now then
    nxt = after
  end
  -- else the check produces the next one: this one is active, or gone (a
  -- tick whose record is gone ended; it is never produced again)
  if nxt then schedule_tick(sid, math.floor(nxt), '', now) end
end

-- Move delayed jobs due by `now` to waiting (at most 1000), in due order.
-- Whatever else becomes ready in the same call goes after them: order of
-- readiness is order of running.
local function promote_due(now)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', fmt(now), 'LIMIT', '0', '1000')
  for _, id in ipairs(due) do
    redis.call('ZREM', K_DELAYED, id)
    local f = redis.call('HMGET', job_key(id), 'state', 'priority', 'lifo')
    if f[1] then
      push_ready(id, tonumber(f[2]) or 0, f[3] == '1')
      redis.call('HSET', job_key(id), 'state', 'waiting')
      emit('waiting', id, { 'prev', 'delayed' })
    end
  end
end

-- Promote due delayed jobs, then take the next job for a worker: the body of
-- moveToActive.lua, also run by complete.lua and fail.lua when the worker
-- asks for its next job in the same call. Returns what moveToActive returns.
local function take_next(token, lock_ms, worker, limit_max, limit_ms, now)
  now = now or now_ms()
  promote_due(now)

  local function next_delay()
    local nxt = redis.call('ZRANGE', K_DELAYED, '0', '0', 'WITHSCORES')
    if nxt[2] then return math.max(0, math.ceil(tonumber(nxt[2]) - now)) end
    return -1
  end

  -- paused: due jobs were promoted above (they wait for the resume); the
  -- worker still needs to know when to look again for the next ones
  if meta()[3] then return { 0, next_delay() } end

  limit_max = tonumber(limit_max)
  local K_LIMITER = base .. 'limiter'
  if limit_max > 0 then
    local used = tonumber(redis.call('GET', K_LIMITER) or '0')
    if not used then  -- not a count (written by hand): start the window afresh
      redis.call('DEL', K_LIMITER)
      used = 0
    end
    if used >= limit_max then
      local ttl = redis.call('PTTL', K_LIMITER)
      if ttl > 0 then return { 2, ttl } end
      redis.call('DEL', K_LIMITER)
    end
  end

  -- the first listed id whose record exists and is waiting: a removed job's
  -- id may linger, and one whose record says it is elsewhere (active,
  -- finished, delayed, waiting for children) is not to run from here
  local id, rec, atm, sch, slot
  for _ = 1, 100 do
    id = redis.call('RPOP', K_WAIT)
    if not id then
      id = redis.call('ZPOPMIN', K_PRIO)[1]
      if not id then
        _none_waiting = true
        return { 0, next_delay() }
      end
    end
    rec = redis.call('HGETALL', job_key(id))
    local state
    atm, sch, slot = 0, nil, nil
    for i = 1, #rec, 2 do
      local field = rec[i]
      if field == 'state' then
        state = rec[i + 1]
      elseif field == 'atm' then
        atm = tonumber(rec[i + 1]) or 0
      elseif field == 'sch' then
        sch = rec[i + 1]
      elseif field == 'slot' then
        slot = rec[i + 1]
      end
    end
    if rec[1] and (state == nil or state == 'waiting') then break end
    rec = nil
  end
  if not rec then  -- only ids not to take so far: look again at once
    mark_ready()
    return { 0, 0 }
  end

  if limit_max > 0 and redis.call('INCR', K_LIMITER) == 1 then
    redis.call('PEXPIRE', K_LIMITER, limit_ms)
  end
  local pon = fmt(now)
  _took = true
  redis.call('ZADD', K_ACTIVE, int(math.floor(now)), id)  -- whole ms: see retain
  redis.call('SET', lock_key(id), token, 'PX', lock_ms)
  redis.call('HSET', job_key(id), 'state', 'active', 'pon', pon, 'pb', worker, 'tok', token)
  emit('active', id, { 'attempt', int(atm + 1), 'worker', worker, 'prev', 'waiting' })
  if sch and slot then advance_scheduler(sch, slot, now) end  -- a tick: produce the next
  -- jobs left to take: wake another idle worker (and tell this one)
  local more = redis.call('LLEN', K_WAIT) > 0 or redis.call('ZCARD', K_PRIO) > 0
  if more then mark_ready() end
  -- the record as it now is (a later field of the same name wins)
  return { 1, id, append(rec, { 'state', 'active', 'pon', pon, 'pb', worker, 'tok', token }),
    more and 1 or 0 }
end

-- Emit `drained` when no job is waiting (plain or prioritized) and none is
-- active: the work given to the queue is done, as BullMQ's users read it.
-- Called when a job leaves active (and after any take in the same call);
-- delayed jobs do not count, they are not ready yet.
local function emit_if_drained()
  if _took then return end  -- the job this call took is active
  if (_none_waiting or redis.call('LLEN', K_WAIT) == 0 and redis.call('ZCARD', K_PRIO) == 0)
      and redis.call('ZCARD', K_ACTIVE) == 0 then
    emit('drained', false, {})
  end
end

-- The job that a take with `token` left locked by it, as take_next returns
-- a taken job ({1, id, record}), or nil. Scans the active set: only calls
-- retried after a lost reply use it.
local function taken_by(token)
  for _, aid in ipairs(redis.call('ZRANGE', K_ACTIVE, '0', '-1')) do
    if redis.call('GET', lock_key(aid)) == token then
      return { 1, aid, redis.call('HGETALL', job_key(aid)) }
    end
  end
  return nil
end

-- The reply of a finalising script: {code, now} (now: the server time of the
-- call, ms, as a string), and the next job taken for the worker,
-- {code, now, take}, when ARGV[i..i+4] carry a take's arguments (token, lock
-- ms, worker, limit max, limit ms). A retried call (code 0: this token
-- finalised the job already) gets back the job its first run took with the
-- same take token, when that job is still locked by it. ARGV[i+5] 'r' (a
-- retry sent while the server is out of memory, when a take is refused):
-- only that job, never a new one.
local function and_take_next(code, i, now)
  local stamp = fmt(now)
  if ARGV[i] and ARGV[i] ~= '' then
    local taken = code == 0 and taken_by(ARGV[i])
    if not taken and ARGV[i + 5] ~= 'r' then
      taken = take_next(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], now)
    end
    return { code, stamp, taken or false }
  end
  return { code, stamp }
end

-- The reply of a finalising script that ended a cancelled attempt
-- (end_cancelled): and_take_next's, with the cancel's reason fourth
-- ({3, now, next or false, reason}), as the record that holds it may be
-- gone already (remove_on_fail).
local function cancelled_reply(i, now, reason)
  local reply = and_take_next(3, i, now)
  reply[3] = reply[3] or false
  reply[4] = reason
  return reply
end
