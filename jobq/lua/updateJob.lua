#!lua
--[[
  Update a job's data, progress or logs.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  what: data | progress | log
  ARGV[3]  the new data / progress (msgpack), or the log line
  ARGV[4]  for log: keep at most this many lines (0: all)
  ARGV[5]  the lock token of the attempt that updates its job (a handler's
           Job), '' for any other caller
  Returns  1 (log: the number of lines); -1 no such job; -2 the attempt
           no longer owns the job (it timed out, or its lock expired and
           another worker took the job over): nothing written
  Events   progress, for progress
]]
local id, what, value = ARGV[1], ARGV[2], ARGV[3]
local jk = job_key(id)
if redis.call('EXISTS', jk) == 0 then return -1 end
if ARGV[5] and ARGV[5] ~= '' and not owns(id, ARGV[5]) then return -2 end
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
