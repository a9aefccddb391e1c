-- requeued.lua: write back, counted, the record of an order whose message
-- the broker confirmed after Redis lost its sale (the backend finds no
-- record to mark queued, see queued.lua). Its message may be behind the
-- sale's drain marker, so the recovery may have ended without counting it:
-- written back as a queued pending record (its units pending and the
-- user's, its key bound), the worker's settle later moves it as any other
-- (a record written settled would make settle.lua skip the counters), and
-- the end of a recovery still running settles it from MySQL if MySQL has
-- it. Nothing changes when Redis knows the order (a record, settled or
-- open), or holds no live sale (the rebuild that builds it restores from
-- MySQL, and its marker comes after this message).
--
-- KEYS[1] meta, KEYS[2] deadlines (see reserve.lua; records and user entries
-- are in the sale's buckets, record.lua)
-- ARGV[1] order id, ARGV[2] quantity, ARGV[3] user id, ARGV[4] deadline
-- (ms), ARGV[5] idempotency key ("" for none)
--
-- Returns 1 when the record was written back, 0 when nothing changed.

local oid, qty, user, deadline, key = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
if not oid or oid == '' or not qty or qty <= 0 or qty % 1 ~= 0 or not user or not deadline or not key then
  return redis.error_reply('requeued.lua: bad arguments')
end
local m = redis.call('HMGET', KEYS[1], 'total', 'archived')
if not m[1] or m[2] then
  return 0
end
local nb = sale_buckets(KEYS[1])
local orders = order_key(KEYS[1], nb, oid)
if redis.call('HEXISTS', orders, oid) == 1 then
  return 0
end
local users = user_key(KEYS[1], nb, user)
local held, index = user_get(users, user)
if key ~= '' and not key_find(index, key) then
  index = index .. '\n' .. key .. '\t' .. oid
end
user_put(users, user, held + qty, index)
redis.call('HINCRBY', KEYS[1], 'pending', qty)
redis.call('HSET', orders, oid, rec_open('P', qty, user, deadline, 'q'))
redis.call('ZADD', KEYS[2], deadline, oid)
return 1
