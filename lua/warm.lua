-- warm.lua: create or update a sale in Redis from MySQL, the truth.
-- Safe to repeat and safe while the sale runs: counters of a live sale
-- (sold, pending, users) are kept, only its settings change.
--
-- KEYS[1] meta, KEYS[2] deadlines (see reserve.lua; records and user entries
-- are in the sale's buckets, record.lua)
-- ARGV[1] total stock, ARGV[2] per-user limit, ARGV[3] start ms, ARGV[4] end ms,
-- ARGV[5] units sold in MySQL, ARGV[6] flags: "u" when user totals follow,
-- "c" create only (a rebuild: a sale that exists is left alone, since its
-- settings may be newer than the caller's unlocked read of MySQL),
-- ARGV[7] pub/sub channel, ARGV[8] activity id, ARGV[9] generation (MySQL's
-- activities.generation, bumped by every admin change; kept in meta "gen"),
-- ARGV[10] the sale's stock shards K (1: unsharded, as before shards),
-- ARGV[11] the sale's stock (all shards), ARGV[12..] user id, units pairs
-- (MySQL's per-user totals of the users homed on this shard) when flags has "u"
--
-- Stock shards (K > 1, reservation.Store.Warm): KEYS are one shard's, and
-- ARGV[1] and ARGV[5] that shard's allotment and sold units when it is
-- created. Flag "z" marks shard 0, which keeps the sale's stock ("stock") and
-- takes an admin change of it as a delta on its own total; flag "s" marks
-- another shard, whose total only moves (move_in.lua, allot.lua): an update
-- changes its settings alone. Every shard's meta holds "shards" = K.
--
-- An archived sale (meta holds "archived": only the summary is left, see
-- archive.lua) counts as missing for a newer generation — an admin change
-- that reopens it rebuilds it whole — and is left alone for the same or an
-- older one, so a stale read never brings an archived sale back.
--
-- Returns
--   {"updated"}                    settings of a live sale changed
--   {"exists"}                     create only, and the sale exists: nothing changed
--   {"archived"}                   the sale is archived at this generation or a
--                                  newer one: nothing changed
--   {"created"}                    the sale was built (fresh, or rebuilt after loss)
--   {"need_users"}                 the sale is missing in Redis, MySQL has sold
--                                  units, and no user totals were given: call again
--                                  with them
--   {"conflict", sold, pending}    the new total is below what Redis has sold or
--                                  reserved: nothing changed
--   {"bad_args"}

local total, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local start_ms, end_ms, sold = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if not total or not limit or not start_ms or not end_ms or not sold or total < 0 or sold < 0 then
  return {'bad_args'}
end
local flags = ARGV[6]
local gen = tonumber(ARGV[9])
if not gen then
  return {'bad_args'}
end
local cur = redis.call('HMGET', KEYS[1], 'total', 'sold', 'pending', 'archived', 'gen', 'buckets', 'stock')
local shards, stock = tonumber(ARGV[10]) or 1, tonumber(ARGV[11]) or total
local zero, other = string.find(flags, 'z', 1, true), string.find(flags, 's', 1, true)
-- A sale keeps its bucket count for life; one built now takes the count
-- restore.lua chose before it (kept in meta, even in an archive's summary),
-- else one from its stock.
local nb = tonumber(cur[6]) or buckets_for(total)
local reopen = false
if cur[4] then
  if gen <= (tonumber(cur[5]) or 0) then
    return {'archived'}
  end
  reopen = true
  cur = {false, false, false}
end
if cur[1] and string.find(flags, 'c', 1, true) then
  return {'exists'}
end
if cur[1] then
  local rsold, rpending = tonumber(cur[2]), tonumber(cur[3])
  if zero then
    total = tonumber(cur[1]) + stock - (tonumber(cur[7]) or stock)
  elseif other then
    total = tonumber(cur[1])
  end
  if total < rsold + rpending then
    return {'conflict', rsold, rpending}
  end
  redis.call('HSET', KEYS[1], 'total', total, 'limit', limit, 'start', start_ms, 'end', end_ms, 'gen', gen)
  if zero then
    redis.call('HSET', KEYS[1], 'stock', stock)
  end
  if total > tonumber(cur[1]) then
    redis.call('PUBLISH', ARGV[7], ARGV[8])
  end
  return {'updated'}
end
if sold > 0 and not string.find(flags, 'u', 1, true) then
  return {'need_users'}
end
if sold > total then
  return {'conflict', sold, 0}
end
if reopen then
  redis.call('DEL', KEYS[1]) -- the summary and its TTL
end
-- Records written while the sale was not in Redis (a tombstone, a settle)
-- or by a version before buckets go into the buckets.
orders_unbucketed(KEYS[1], nb)
-- Only the meta hash may have been lost (eviction, a partial flush): open
-- reservations that survived still hold units, so count them back in, or their
-- later settle or release would drive pending below zero.
local held = {}
for i = 12, #ARGV, 2 do
  held[ARGV[i]] = (held[ARGV[i]] or 0) + tonumber(ARGV[i + 1])
end
local pending = open_recount(KEYS[1], nb, KEYS[2], held)
-- The counts are MySQL's and the open records'; key indexes that survived
-- (or that a restore wrote first, see restore.lua) stay.
users_rebuild(KEYS[1], nb, held)
redis.call('HSET', KEYS[1], 'total', total, 'sold', sold, 'pending', pending,
  'limit', limit, 'start', start_ms, 'end', end_ms, 'gen', gen, 'buckets', nb)
if shards > 1 then
  redis.call('HSET', KEYS[1], 'shards', shards)
  if zero then
    redis.call('HSET', KEYS[1], 'stock', stock)
  end
end
redis.call('PUBLISH', ARGV[7], ARGV[8])
return {'created'}
