#!lua flags=no-writes
--[[
  Read the per-minute metrics of one kind of finished job (see record_metric
  in _common.lua), in one snapshot with the server's clock.

  KEYS[1]  queue base prefix
  ARGV[1]  'completed' or 'failed'
  Returns  {now ms, count, wait ms, run ms, minute being counted or false,
            count at its start, {finished minutes' counts, newest first}}
]]
local key = base .. 'metrics:' .. ARGV[1]
local m = redis.call('HMGET', key, 'count', 'wait', 'run', 'min', 'mbase')
-- the minutes record_metric keeps, each a number (a list written by hand,
-- longer or with a count that is none, is read as that: 0 for the count)
local counts = redis.call('LRANGE', key .. ':data', '0', METRICS_MINUTES - 1)
for i, c in ipairs(counts) do
  local n = tonumber(c)
  counts[i] = (n and n == n and n > -math.huge and n < math.huge) and n or 0
end
return { now_ms(), tonumber(m[1]) or 0, tonumber(m[2]) or 0, tonumber(m[3]) or 0,
         tonumber(m[4]) or false, tonumber(m[5]) or 0, counts }
