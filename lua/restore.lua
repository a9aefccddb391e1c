-- restore.lua: write back orders MySQL has decided — their records, and the
-- idempotency keys in their users' entries — after Redis lost a sale, or
-- before an archived sale reopens, so that a client retrying with its key
-- gets its order again instead of a second one. What Redis holds wins (a
-- record that exists, a key the user's entry names already): anything Redis
-- learnt is newer than MySQL's decided state. Counts are not touched:
-- warm.lua sets them from MySQL, and keeps the key indexes written here.
--
-- KEYS[1] meta (see reserve.lua; records and entries go to the sale's
-- buckets, record.lua)
-- ARGV[1] total stock (MySQL), which chooses the bucket count when the sale
-- has none yet and is built anew (no sale, or an archive's summary; the warm
-- that follows keeps the count); 0 to choose none (the records then go to
-- the unbucketed hashes, which warm.lua moves into buckets). A live sale
-- without buckets (warmed before them) keeps its unbucketed hashes.
-- ARGV[2..]: six values per order: order id, "K" | "F" | "" (the key only:
-- the record is settle.lua's to write, with the counters), reason, quantity,
-- user id and its idempotency key ("" for none)
--
-- Returns the number of records written.

local nb = sale_buckets(KEYS[1])
local total = tonumber(ARGV[1]) or 0
local m = redis.call('HMGET', KEYS[1], 'total', 'archived')
if not nb and total > 0 and (not m[1] or m[2]) then
  nb = buckets_for(total)
  redis.call('HSET', KEYS[1], 'buckets', nb)
end
local written = 0
for i = 2, #ARGV, 6 do
  local oid, state, reason, qty, user, key = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  if state ~= '' then
    written = written + redis.call('HSETNX', order_key(KEYS[1], nb, oid), oid, rec_done(state, qty, user, reason))
  end
  if key ~= '' then
    local users = user_key(KEYS[1], nb, user)
    local held, index = user_get(users, user)
    if not key_find(index, key) then
      user_put(users, user, held, index .. '\n' .. key .. '\t' .. oid)
    end
  end
end
return written
