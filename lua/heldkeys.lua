-- heldkeys.lua: the idempotency keys that hold an order in a sold-out sale,
-- read in one step with the check that it is sold out, for the proxy's
-- answers to keyed purchases (docs/contract.md, "Proxy"). While no unit is
-- left, no key can be added (a new reservation needs a unit) and none leaves
-- (a failed order keeps its key; the units of one that is released come
-- back, which publishes a stock event): the set read here stays exact until
-- the next stock event of the sale.
--
-- The keys are read a page of hashes per call, so that a sale of many keys
-- never holds Redis for long; each call checks again that no unit is left,
-- and a unit coming back between calls publishes a stock event, which voids
-- the whole read for its caller (the proxy's token rule).
--
-- KEYS[1] meta, KEYS[2] recovering (see reserve.lua; the user entries are in
-- the sale's buckets, record.lua)
-- ARGV[1] the most keys the caller still keeps, ARGV[2] the first hash to
-- read (0 the unbucketed one, b + 1 bucket b), ARGV[3] how many hashes
--
-- Returns
--   {"keys", next, user, index, user, index, ...}
--                                            sold out; next: ARGV[2] of the
--                                            next call (0: every hash read);
--                                            then each user of these hashes
--                                            that reserved with a key, and the
--                                            key index of its entry ("\n<key>\t<order id>" each)
--   {"open"}                                 units are left
--   {"not_found"}                            the sale is not in Redis
--   {"recovering"}                           rebuilt after a Redis loss: keys
--                                            of orders queued before it may be missing
--   {"sharded"}                              a sale of several stock shards
--                                            (its keys are spread over slots)
--   {"too_many"}                             more than ARGV[1] keys in these hashes

local meta = redis.call('HMGET', KEYS[1], 'total', 'sold', 'pending', 'buckets', 'shards')
if not meta[1] then
  return {'not_found'}
end
if (tonumber(meta[5]) or 1) > 1 then
  return {'sharded'}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'recovering'}
end
if tonumber(meta[1]) - (tonumber(meta[2]) or 0) - (tonumber(meta[3]) or 0) > 0 then
  return {'open'}
end
local most, first, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local hashes = sale_hashes(KEYS[1], tonumber(meta[4]), 'u')
local last = math.min(#hashes, first + count)
local out, n = {'keys', last < #hashes and last or 0}, 0
for h = first + 1, last do
  local all = redis.call('HGETALL', hashes[h])
  for i = 1, #all, 2 do
    local _, index = user_split(all[i + 1])
    if index ~= '' then
      local _, keys = string.gsub(index, '\n', '\n')
      n = n + keys
      if n > most then
        return {'too_many'}
      end
      out[#out + 1] = all[i]
      out[#out + 1] = index
    end
  end
end
return out
