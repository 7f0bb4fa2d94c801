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
return { now_ms(), tonumber(m[1]) or 0, tonumber(m[2]) or 0, tonumber(m[3]) or 0,
         tonumber(m[4]) or false, tonumber(m[5]) or 0,
         redis.call('LRANGE', key .. ':data', '0', '-1') }
