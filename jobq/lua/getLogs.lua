#!lua flags=no-writes
--[[
  Read the newest lines of a job's log within a size budget (the dashboard's
  job page): each line cut to a number of bytes, and no more lines once the
  lines read add up to the budget. A log line may be as long as a payload
  (a MiB by default), so a page of 200 of them read whole was 200 MiB.

  KEYS[1]  queue base prefix
  ARGV[1]  job id
  ARGV[2]  most lines to read
  ARGV[3]  most bytes of a line
  ARGV[4]  the budget: no line is read once the lines read add up to it
  Returns  {lines in the log, {length in bytes, first bytes}, …} of the
           lines read, newest first
]]
local key = base .. 'logs:' .. ARGV[1]
local most, cut, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = { redis.call('LLEN', key) }
for i = 1, math.min(most, out[1]) do
  if budget <= 0 then break end
  local line = redis.call('LRANGE', key, -i, -i)[1]  -- (LINDEX: one more command to grant)
  if not line then break end
  local shown = string.sub(line, 1, cut)
  budget = budget - #shown
  out[#out + 1] = { #line, shown }
end
return out
