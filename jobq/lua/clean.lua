#!lua
--[[
  Remove jobs of one state older than a grace period, a batch per call.
  Finished jobs are aged by when they finished, others by when they were
  added.

  KEYS[1]  queue base prefix
  ARGV[1]  state: completed | failed | delayed | waiting
  ARGV[2]  grace, ms
  ARGV[3]  batch size
  Returns  the ids removed
  Events   cleaned (count), when any job was removed
]]
local state = ARGV[1]
local cutoff = now_ms() - tonumber(ARGV[2])
local batch = tonumber(ARGV[3])
local out = {}
local function older(id)
  local ts = tonumber(redis.call('HGET', job_key(id), 'ts'))
  return ts == nil or ts <= cutoff
end
if state == 'completed' or state == 'failed' then
  local set = base .. state
  out = redis.call('ZRANGEBYSCORE', set, '-inf', cutoff, 'LIMIT', 0, batch)
  if #out > 0 then redis.call('ZREM', set, unpack(out)) end
elseif state == 'delayed' then
  for _, id in ipairs(redis.call('ZRANGE', K_DELAYED, 0, -1)) do
    if older(id) then
      redis.call('ZREM', K_DELAYED, id)
      out[#out + 1] = id
      if #out >= batch then break end
    end
  end
elseif state == 'waiting' then
  -- the oldest jobs sit at the right end of the wait list
  local ids = redis.call('LRANGE', K_WAIT, 0, -1)
  for i = #ids, 1, -1 do
    if #out >= batch then break end
    if older(ids[i]) then
      redis.call('LREM', K_WAIT, 1, ids[i])
      out[#out + 1] = ids[i]
    end
  end
  for _, id in ipairs(redis.call('ZRANGE', K_PRIO, 0, -1)) do
    if #out >= batch then break end
    if older(id) then
      redis.call('ZREM', K_PRIO, id)
      out[#out + 1] = id
    end
  end
end
for _, id in ipairs(out) do delete_job(id) end
if #out > 0 then emit('cleaned', false, { 'count', #out, 'state', state }) end
return out
