#!lua
--[[
  Delete a queue and all its jobs, a batch of jobs per call.

  KEYS[1]  queue base prefix
  ARGV[1]  '1' to proceed even with active jobs
  ARGV[2]  batch size
  Returns  jobs deleted in this call (less than the batch size: the queue is
           gone); -4 when active jobs exist and force is not set
  Events   none (the event stream is deleted with the queue)
]]
if ARGV[1] ~= '1' and redis.call('ZCARD', K_ACTIVE) > 0 then return -4 end
local batch = tonumber(ARGV[2])
local n = 0
for _, key in ipairs({ K_WAIT }) do
  for _, id in ipairs(redis.call('LPOP', key, batch) or {}) do
    delete_job(id)
    n = n + 1
  end
end
for _, key in ipairs({ K_PRIO, K_DELAYED, K_ACTIVE, K_COMPLETED, K_FAILED }) do
  if n >= batch then break end
  local ids = redis.call('ZRANGE', key, 0, batch - n - 1)
  for _, id in ipairs(ids) do
    delete_job(id)
    n = n + 1
  end
  if #ids > 0 then redis.call('ZREM', key, unpack(ids)) end
end
if n < batch then
  for _, name in ipairs(redis.call('ZRANGE', base .. 'workers', 0, -1)) do
    redis.call('DEL', base .. 'worker:' .. name)
  end
  redis.call('DEL', K_WAIT, K_PRIO, K_DELAYED, K_ACTIVE, K_COMPLETED, K_FAILED, K_META,
    K_EVENTS, K_MARKER, base .. 'id', base .. 'pc', base .. 'limiter', base .. 'stalled-check',
    base .. 'workers', base .. 'metrics:completed', base .. 'metrics:completed:data',
    base .. 'metrics:failed', base .. 'metrics:failed:data')
end
return n
