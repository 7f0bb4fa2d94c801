#!lua flags=no-writes
--[[
  Count the jobs in every state, in one consistent snapshot.

  KEYS[1]  queue base prefix
  Returns  {waiting, delayed, active, completed, failed, paused (0 | 1),
           waiting-children}
]]
return { redis.call('LLEN', K_WAIT) + redis.call('ZCARD', K_PRIO),
         redis.call('ZCARD', K_DELAYED), redis.call('ZCARD', K_ACTIVE),
         redis.call('ZCARD', K_COMPLETED), redis.call('ZCARD', K_FAILED),
         redis.call('HGET', K_META, 'paused') == '1' and 1 or 0,
         redis.call('ZCARD', base .. 'waiting-children') }
