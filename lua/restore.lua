-- restore.lua: write back orders MySQL has decided — their records, and the
-- idempotency keys in their users' entries — after Redis lost a sale, or
-- before an archived sale reopens, so that a client retrying with its key
-- gets its order again instead of a second one. What Redis holds wins (a
-- record that exists, a key the user's entry names already): anything Redis
-- learnt is newer than MySQL's decided state. Counts are not touched:
-- warm.lua sets them from MySQL, and keeps the key indexes written here.
--
-- KEYS[1] users, KEYS[2] orders (see reserve.lua)
-- ARGV: six values per order: order id, "K" | "F" | "" (the key only: the
-- record is settle.lua's to write, with the counters), reason, quantity, user
-- id and its idempotency key ("" for none)
--
-- Returns the number of records written.

local written = 0
for i = 1, #ARGV, 6 do
  local oid, state, reason, qty, user, key = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  if state ~= '' then
    written = written + redis.call('HSETNX', KEYS[2], oid, rec_done(state, qty, user, reason))
  end
  if key ~= '' then
    local held, index = user_get(KEYS[1], user)
    if not key_find(index, key) then
      user_put(KEYS[1], user, held, index .. '\n' .. key .. '\t' .. oid)
    end
  end
end
return written
