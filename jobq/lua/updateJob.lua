#!lua
--[[
  Update a job's data, progress or logs.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  what: data | progress | log
  ARGV[3]  the new data / progress (msgpack), or the log line
  ARGV[4]  for log: keep at most this many lines (0: all)
  Returns  1 (log: the number of lines); -1 no such job
  Events   progress, for progress
]]
local id, what, value = ARGV[1], ARGV[2], ARGV[3]
local jk = job_key(id)
if redis.call('EXISTS', jk) == 0 then return -1 end
if what == 'data' then
  redis.call('HSET', jk, 'data', value)
elseif what == 'progress' then
  redis.call('HSET', jk, 'prog', value)
  emit('progress', id, { 'progress', value })
else
  local lk = base .. 'logs:' .. id
  local n = redis.call('RPUSH', lk, value)
  local keep = tonumber(ARGV[4])
  if keep > 0 and n > keep then
    redis.call('LTRIM', lk, -keep, '-1')
    n = keep
  end
  return n
end
return 1
