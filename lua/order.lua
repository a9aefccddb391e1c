-- order.lua: read one order's record from its bucket (record.lua) in one
-- round trip (the bucket count is in meta; reading it first from Go would
-- cost a second one on every order lookup).
--
-- KEYS[1] meta (see reserve.lua)
-- ARGV[1] order id
--
-- Returns the record, or nil when Redis has none.

return redis.call('HGET', order_key(KEYS[1], sale_buckets(KEYS[1]), ARGV[1]), ARGV[1])
