#!lua flags=allow-oom
--[[
  Remove a job scheduler and its pending delayed tick job (a tick job
  already waiting or active runs as usual, and so does one a worker took
  that waits for a retry).

  KEYS[1]  queue base prefix
  ARGV[1]  scheduler id
  Returns  1 removed; 0 no such scheduler
  Events   removed (prev delayed) for its pending tick job
]]
local sid = ARGV[1]
local skey = base .. 'scheduler:' .. sid
local nxt = redis.call('HGET', skey, 'next')
if not nxt then return 0 end
if nxt ~= '' then
  local pid = tick_id(sid, tonumber(nxt))
  if untaken_tick(pid) == 'delayed' then
    redis.call('ZREM', K_DELAYED, pid)
    delete_job(pid, true)
    emit('removed', pid, { 'prev', 'delayed' })
  end
end
redis.call('DEL', skey)
redis.call('ZREM', K_SCHEDULERS, sid)
return 1
