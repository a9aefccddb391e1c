-- allot.lua: move a stock shard's total by delta (the reconciler's repair of
-- a sharded sale whose shard totals no longer add up to MySQL's stock, read
-- from a consistent snapshot of every shard: see reservation.Store.Sync). A
-- delta, not a value: reservations meanwhile do not touch totals, and moves
-- keep their sum.
--
-- KEYS[1] the shard's meta
-- ARGV[1] delta, ARGV[2] pub/sub channel, ARGV[3] activity id
--
-- Returns the new total, or nil when the shard is not in Redis.

if redis.call('HEXISTS', KEYS[1], 'total') == 0 then
  return nil
end
local d = tonumber(ARGV[1])
local t = redis.call('HINCRBY', KEYS[1], 'total', d)
if d > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return t
