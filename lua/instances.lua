-- instances.lua: heartbeat of one proxy instance; counts the live ones, so
-- that a speculative lease takes at most free / (2 * live) slots of a window.
--
-- KEYS[1]  live-instance set (member = instance id, score = last heartbeat, µs
--          of Redis TIME); its own hash tag
-- ARGV[1]  instance id
-- ARGV[2]  liveness in ms: instances silent longer are not counted
--
-- Returns the number of live instances (this one included).
-- Errors (before any write): a bad liveness.
local liveness = tonumber(ARGV[2])
if #ARGV ~= 2 or not liveness or liveness < 1 then
  return redis.error_reply('ERR instances: want ARGV id, liveness_ms')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - liveness * 1000)
redis.call('PEXPIRE', KEYS[1], liveness * 2)
return redis.call('ZCARD', KEYS[1])
