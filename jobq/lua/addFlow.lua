#!lua
--[[
  Add a flow atomically: a tree of jobs, parents before their children, in
  any queues of one prefix (one slot on a cluster: FlowProducer checks), or
  one job that depends on existing jobs (add(..., depends_on=...)).

  KEYS[1]  base prefix of the first node's queue
  ARGV[1]  N, the number of nodes
  ARGV[2..] 20 values per node: the base of its queue, the index (1-based, in this call) of its
           parent node or 0, its failure policy ('' the parent waits on it,
           'f' fail the parent, 'i' ignore, 'r' remove the dependency), then
           add.lua's 17 values (job_id, name, data, opts, delay_ms,
           priority, lifo, attempts, keep_completed_count,
           keep_completed_age_ms, keep_failed_count, keep_failed_age_ms,
           dedup id, dedup ttl, extend, replace, trace context; dedup is
           not used in flows). A node whose name is '' names an existing
           job (a dependency): it must exist.
  ARGV[2 + N * 20] optional: one character per node, '1' when its caller's
           queue is in pub/sub mode (checked to be the mode stored)
  Returns  {timestamp ms, id, duplicated, added, ...} per node as add.lua
           (duplicated: 0 written; 1 an existing job, left as it was and
           adopted as a child when it has a parent node; 4 not written,
           under a node that existed), then the index i of each node written
           whose queue has no mark of stored settings, or not the pub/sub
           mode its caller's has (add.lua's 'unset'; the caller stores them
           again); or {-1, i}: node i names no existing
           job (nothing written); {-6, i}: node i is an existing job with
           another parent (nothing written)
  Events   per node written: added, then waiting-children (a node with
           children), waiting or delayed; duplicated for a named node that
           existed. A parent whose adopted children had all finished moves
           on (waiting, prev waiting-children) or fails (policy 'f') here.
  Adopted  an existing child: completed, its result counts as done (any
           number of parents may adopt it); else it is linked to its new
           parent (fields pid, pqb, fpol when a policy is given; it may have
           one parent): pending, the parent waits for it; failed, its
           failure policy (the node's, else its own) applies at once.
]]
local W = 20
local n = tonumber(ARGV[1])
local now = now_ms()
local nodes = {}
local modes = ARGV[2 + n * W] or ''
for i = 1, n do
  local a = 2 + (i - 1) * W
  local node = { qb = ARGV[a], parent = tonumber(ARGV[a + 1]), policy = ARGV[a + 2], a = a + 3,
    id = ARGV[a + 3], name = ARGV[a + 4], pubsub = string.sub(modes, i, i) == '1' }
  if node.id ~= '' then
    local f = redis.call('HMGET', node.qb .. 'job:' .. node.id, 'state', 'pid', 'pqb', 'rv', 'fr',
      'fpol')
    if f[1] then node.existing = f end
  end
  if node.name == '' and not node.existing then return { -1, i } end
  nodes[i] = node
end
-- a node under a node that existed is not written (an existing job keeps
-- its children); an existing child may have no other parent
for i = 1, n do
  local node = nodes[i]
  local p = nodes[node.parent]
  if p then
    node.skip = p.skip or p.existing ~= nil
    if not node.skip then
      p.kids = true
      local f = node.existing
      if f and f[1] ~= 'completed' and f[2] and not (f[2] == p.id and f[3] == p.qb) then
        return { -6, i }
      end
    end
  end
end

-- settings at their default are not stored (as add.lua)
local SETTINGS = { 'atts', 'kc', 'ka', 'kfc', 'kfa' }
local DEFAULTS = { '1', '-1', '0', '-1', '0' }
local finished = {}  -- adopted children that ended already: told after the writes

local function write_node(node)
  local a = node.a
  local id = node.id
  if id == '' then id = tostring(redis.call('INCR', base .. 'id')) end
  node.id = id
  local delay = tonumber(ARGV[a + 4])
  local priority = tonumber(ARGV[a + 5])
  local lifo = ARGV[a + 6]
  local fields = { 'name', ARGV[a + 1], 'data', ARGV[a + 2], 'opts', ARGV[a + 3], 'ts', fmt(now) }
  if node.kids then
    append(fields, { 'state', 'waiting-children', 'kids', '1' })
    if delay > 0 then append(fields, { 'delay', delay }) end
  elseif delay > 0 then
    append(fields, { 'state', 'delayed', 'rdy', now + delay, 'delay', delay })
  else
    append(fields, { 'state', 'waiting', 'rdy', fmt(now) })
  end
  if priority ~= 0 or delay > 0 or ARGV[a + 7] ~= '1' then  -- as add.lua (0.1 workers)
    append(fields, { 'priority', priority })
  end
  if lifo == '1' then append(fields, { 'lifo', lifo }) end
  for j, name in ipairs(SETTINGS) do
    local value = ARGV[a + 6 + j]
    if value ~= DEFAULTS[j] then append(fields, { name, value }) end
  end
  local p = nodes[node.parent]
  if p then append(fields, { 'pid', p.id, 'pqb', p.qb }) end
  if node.policy ~= '' then append(fields, { 'fpol', node.policy }) end
  if ARGV[a + 16] ~= '' then append(fields, { 'tc', ARGV[a + 16] }) end
  redis.call('HSET', job_key(id), unpack(fields))
  local added = emit('added', id, { 'job_name', ARGV[a + 1], 'delay', delay,
    'priority', priority })
  if node.kids then
    redis.call('ZADD', base .. 'waiting-children', fmt(now), id)
    emit('waiting-children', id, {})
  elseif delay > 0 then
    add_delayed(id, now + delay)  -- ties keep the order of the nodes
    emit('delayed', id, { 'delay', delay, 'run_at', now + delay })
  else
    push_ready(id, priority, lifo == '1')
    emit('waiting', id, {})
  end
  node.unset = not meta()[6] or (node.pubsub and meta()[1] ~= 'pubsub')
  return added
end

-- an existing job under a new parent becomes its child
local function adopt(node, p)
  local f = node.existing
  if f[1] == 'completed' then  -- its result is copied: any number of jobs may use it
    finished[#finished + 1] = { node, p, 'completed', f[4] or '', '' }
    return
  end
  local jk = job_key(node.id)
  redis.call('HSET', jk, 'pid', p.id, 'pqb', p.qb)
  if node.policy ~= '' then redis.call('HSET', jk, 'fpol', node.policy) end
  if f[1] == 'failed' then
    local policy = node.policy
    if policy == '' then policy = f[6] or '' end
    finished[#finished + 1] = { node, p, 'failed', f[5] or '', policy }
  end
end

local out = { fmt(now) }
for i = 1, n do
  local node = nodes[i]
  local p = nodes[node.parent]
  local dup, added = 0, ''
  if node.skip then
    dup = 4
  elseif node.existing then
    dup = 1
    if node.name ~= '' then in_queue(node.qb, emit, 'duplicated', node.id, {}) end
    if p then in_queue(node.qb, adopt, node, p) end
  else
    added = in_queue(node.qb, write_node, node)
  end
  if p and not node.skip then
    redis.call('SADD', p.qb .. 'deps:' .. p.id, queue_of(node.qb) .. ':' .. node.id)
  end
  out[#out + 1] = node.id
  out[#out + 1] = dup
  out[#out + 1] = added
end
for _, e in ipairs(finished) do
  local node, p = e[1], e[2]
  in_queue(p.qb, child_ended, p.id, queue_of(node.qb) .. ':' .. node.id, e[3], e[4], e[5], now)
end
-- a new parent whose children were all adopted and ended moves on now
for i = 1, n do
  local node = nodes[i]
  if node.kids and not node.existing and not node.skip
      and redis.call('SCARD', node.qb .. 'deps:' .. node.id) == 0 then
    in_queue(node.qb, release_parent, node.id, now)
  end
end
for i = 1, n do
  if nodes[i].unset then out[#out + 1] = i end
end
return out
