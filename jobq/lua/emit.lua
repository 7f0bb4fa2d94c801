#!lua
--[[
  Publish a custom event on the queue's event channel.

  KEYS[1]  queue base prefix
  ARGV[1]  event name
  ARGV[2..] field, value (msgpack) pairs
  Returns  1
  Events   the custom event, marked with field c = 1
]]
local fields = { 'c', '1' }
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
emit(ARGV[1], false, fields)
return 1
