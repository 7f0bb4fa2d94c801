#!lua flags=allow-oom
--[[
  Renew the locks of a worker's active jobs in one call.

  KEYS[1]  queue base prefix
  ARGV[1]  lock duration, ms
  ARGV[2..] pairs of job id, lock token
  Returns  {lost, cancelled}: the given tokens that no longer hold their
           job's lock (tokens, not ids: one job may be in flight under an
           old and a new token), and those whose job's cancel was requested
           (cancel.lua's durable mark: a cancel hint the worker missed)
  Events   none
]]
local lost, cancelled = {}, {}
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if owns(id, token) then
    redis.call('SET', lock_key(id), token, 'PX', ARGV[1])
    if redis.call('HEXISTS', job_key(id), 'cx') == 1 then cancelled[#cancelled + 1] = token end
  else
    lost[#lost + 1] = token
  end
end
return { lost, cancelled }
