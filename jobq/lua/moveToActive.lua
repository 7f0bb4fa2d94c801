#!lua
--[[
  Promote due delayed jobs, then take the next job for a worker.

  KEYS[1]  queue base prefix
  ARGV[1]  lock token
  ARGV[2]  lock duration, ms
  ARGV[3]  worker name
  ARGV[4]  rate limit: max jobs per window (0: no limit)
  ARGV[5]  rate limit window, ms
  ARGV[6]  optional: '1' when this call retries a take whose reply was lost:
           the job that take locked with the same token, if any, is
           returned as taken
  Returns  {1, id, {job hash field, value, ...}, more}  a job was taken;
                     more: 1 when other jobs wait to be taken, else 0
           {0, ms}   nothing to take, or the queue is paused; ms until
                     the next delayed job, or -1 (a paused queue's due
                     delayed jobs are promoted all the same)
           {2, ms}   rate limited for ms more
  Events   waiting (prev delayed) per promoted job; active (a take never
           writes drained: the job it takes is active)
]]
if ARGV[6] == '1' then
  local taken = taken_by(ARGV[1])
  if taken then return taken end
end
return take_next(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
