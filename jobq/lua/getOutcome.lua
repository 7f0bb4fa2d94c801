#!lua flags=no-writes
--[[
  Read what a waiter needs of a job, with the event checkpoint of the same
  instant: every event written before this call has an id <= checkpoint.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  Returns  {state or false, return value, failed reason, stack traces,
            last event id or ''}
]]
local f = redis.call('HMGET', job_key(ARGV[1]), 'state', 'rv', 'fr', 'st')
local last = ''
if meta()[1] ~= 'pubsub' then
  local e = redis.call('XREVRANGE', K_EVENTS, '+', '-', 'COUNT', 1)
  if e[1] then last = e[1][1] end
end
return { f[1], f[2], f[3], f[4], last }
