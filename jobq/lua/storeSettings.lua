#!lua flags=allow-oom
--[[
  Store a Queue's settings: on its first use, and again after the server
  lost its data (an add found the mark of stored settings, meta field cfg,
  missing: see add.lua). A mode stored by another Queue is kept; a
  max_events or result TTL given is written. A field is written only when
  it differs (a reader whose ACL grants no write opens a queue a writer
  set up), and nothing for the name of a sharded queue (a plain Queue
  opened on it is refused). Runs when the server is out of memory: a
  reader's first use must.

  KEYS[1]  queue base prefix
  ARGV[1]  event mode ('' not given)
  ARGV[2]  max_events ('' not given)
  ARGV[3]  result TTL in ms ('' not given)
  ARGV[4]  what more to write: 'c' the mark of stored settings, 's' the
           shard mark (a shard of a sharded queue: its scripts publish
           wake-ups), 'f' (with 's': the sharded queue's count was stored
           just now) refuse a name that is a plain queue holding jobs, 'p'
           the caller's client is a cluster's (the server is asked too) (a writer
           stores field sp in pub/sub mode: events are published with
           SPUBLISH, on the queue's own node, rather than PUBLISH), in any
           combination ('' none)
  ARGV[5]  the number of the caller's database: stored in pub/sub mode by
           a writer (a mode given, or 'c'; field db: the scripts cannot
           tell it). Every pub/sub event
           carries it: a channel's name has no database in it, so the queues
           of one name in several databases of a server share their
           channel, and readers drop the events of another database
  Returns  {event mode, max_events, result TTL in ms, shard count}, as
           stored (false for each not stored); then '1' when 'f' was asked
           of a name that is a plain queue holding jobs (no shard mark: a
           shard's name of a sharded queue, taken by a plain queue before
           it; nothing written: the sharded queue's workers would take its
           jobs over), else false; then the shard mark (a plain Queue
           opened on a shard's name is refused)
  Events   none; storing pub/sub mode adds the entry that tells the
           stream's readers (jobq/_reader.py _MODE_STORED), with a shard's
           wake-up; the stream goes a minute later (pub/sub mode keeps none)
]]
local FIELDS = { 'em', 'maxev', 'rttl', 'shards', 'cfg', 'shard', 'db', 'sp' }
local m = redis.call('HMGET', K_META, unpack(FIELDS))
local function stored() return { m[1], m[2], m[3], m[4], false, m[6] } end
if m[4] then return stored() end
if string.find(ARGV[4], 'f', 1, true) and not m[6] and holds_jobs() then
  local reply = stored()
  reply[5] = '1'
  return reply
end
-- each field is written only when it differs: a reader's first use (a
-- monitor's ACL grants no write) writes nothing of what a writer stored
local function set(i, value)
  if m[i] ~= value then
    redis.call('HSET', K_META, FIELDS[i], value)
    m[i] = value
  end
end
local writes = ARGV[4]
local writer = ARGV[1] ~= '' or string.find(writes, 'c', 1, true) ~= nil
local told = false
if ARGV[1] ~= '' and not m[1] then
  set(1, ARGV[1])
  if ARGV[1] == 'pubsub' then
    redis.call('XADD', K_EVENTS, '*', 'ev', '__jobq_mode__')
    redis.call('PEXPIRE', K_EVENTS, 60000)
    told = true
  end
end
if ARGV[2] ~= '' then set(2, ARGV[2]) end
if ARGV[3] ~= '' then set(3, ARGV[3]) end
if string.find(writes, 'c', 1, true) then set(5, '1') end
if string.find(writes, 's', 1, true) then set(6, '1') end
if writer and m[1] == 'pubsub' then
  set(7, ARGV[5])
  -- a cluster's node, whatever the caller's client (a plain one may talk
  -- to a one-node cluster): CLUSTER MYID answers there only (an ACL that
  -- refuses it leaves the client's word)
  if string.find(writes, 'p', 1, true) or type(redis.pcall('CLUSTER', 'MYID')) == 'string' then
    set(8, '1')
  end
end
if told and m[6] == '1' then
  -- a shard: its readers read the entry on this wake-up (as after emit's)
  redis.call('SPUBLISH', K_EVENTS, WAKE_READERS)
end
return stored()
