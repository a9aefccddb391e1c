-- reserve_multi.lua: reserve.lua for a group of purchase attempts of one sale
-- shard in one call (the backend's group commit): reserve_one (reserving.lua)
-- runs for each request in turn, with every check of its own, and each gets
-- its own reply. One call instead of one per request: one round trip, one
-- script dispatch.
--
-- KEYS[1] meta, KEYS[2] deadlines, KEYS[3] recovering (as reserve.lua's), then
-- for request i (1-based) KEYS[2+2i] the bucket of its order's record and
-- KEYS[3+2i] the bucket of its user's entry: requests of one group touch
-- different buckets, all of the shard's hash tag (one slot)
-- ARGV[1] reservation TTL in ms, ARGV[2] the bucket count the caller named
-- the buckets for (0: unbucketed), ARGV[3] the sale's stock shard count the
-- caller chose this shard (and the order ids) for, then 4 per request: user
-- id, idempotency key ("" for none), quantity, order id (chosen by the caller
-- before the call)
--
-- Returns one reply per request, in order, each exactly reserve.lua's for that
-- request alone run at that point: a request sees what the ones before it in
-- the group reserved (stock, the user's units, keys), so two requests of one
-- user with one key are a reservation and its replay. A stale bucket count is
-- answered {"buckets", n} for every request (nothing read or written); a
-- stale shard count {"shards", k} for every request (reserve_one checks it on
-- the meta it reads once per call, before anything else: nothing written). A shard's
-- "sold_out" or "insufficient" says nothing of the sale's other shards: the
-- caller sends such a request again alone, through reserve.lua's caller,
-- which moves units in first.
-- Idempotent on the group as reserve.lua is on one request: a repeat of the
-- same call finds each request's own record.

local n = (#KEYS - 3) / 2
if n < 1 or n ~= math.floor(n) or #ARGV ~= 3 + 4 * n then
  return redis.error_reply('ERR reserve_multi: ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments do not fit')
end
local out = {}
local sc = {} -- the meta is read once, by the first reserve_one
for i = 1, n do
  local a = 3 + 4 * (i - 1)
  out[i] = reserve_one(sc, KEYS[1], KEYS[2], KEYS[3], KEYS[2 + 2 * i], KEYS[3 + 2 * i],
    ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[1], ARGV[2], ARGV[3])
end
return out
