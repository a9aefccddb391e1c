-- sync.lua: make a sale's Redis counters exact from MySQL's facts, for the
-- reconciler's forced pass. The caller holds MySQL's row lock on the activity
-- (SELECT ... FOR UPDATE), so no worker commits meanwhile, and has settled
-- every pending or claimed order that MySQL already holds. What is still
-- pending is recounted here from the reservation records, atomically with
-- respect to reserve.lua.
--
-- KEYS[1] meta, KEYS[2] deadlines (see reserve.lua; records and user entries
-- are in the sale's buckets, record.lua)
-- ARGV[1] total stock (MySQL; "-" keeps the total: a stock shard's, which
-- only moves, see reservation.Store.Sync), ARGV[2] units sold (MySQL), ARGV[3] pub/sub
-- channel, ARGV[4] activity id, ARGV[5..] user id, units pairs (MySQL's
-- per-user confirmed totals)
--
-- Returns {"missing"} when the sale is not in Redis (nothing changed), else
-- {"synced", old_total, old_sold, old_pending, new_pending, stale_index}
-- where stale_index counts settled orders dropped from the deadline index.

local cur = redis.call('HMGET', KEYS[1], 'total', 'sold', 'pending')
if not cur[1] then
  return {'missing'}
end
local total, sold = tonumber(ARGV[1]) or tonumber(cur[1]), tonumber(ARGV[2])
local held = {}
for i = 5, #ARGV, 2 do
  held[ARGV[i]] = (held[ARGV[i]] or 0) + tonumber(ARGV[i + 1])
end
local nb = sale_buckets(KEYS[1])
local pending, stale = open_recount(KEYS[1], nb, KEYS[2], held)
-- Counts from MySQL and the open records; the users' key indexes stay.
users_rebuild(KEYS[1], nb, held)
redis.call('HSET', KEYS[1], 'total', total, 'sold', sold, 'pending', pending)
if total - sold - pending > tonumber(cur[1]) - tonumber(cur[2]) - tonumber(cur[3]) then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return {'synced', tonumber(cur[1]), tonumber(cur[2]), tonumber(cur[3]), pending, stale}
