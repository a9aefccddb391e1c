-- heldkeys.lua: the idempotency keys that hold an order in a sold-out sale,
-- read in one step with the check that it is sold out, for the proxy's
-- answers to keyed purchases (docs/contract.md, "Proxy"). While no unit is
-- left, no key can be added (a new reservation needs a unit) and none leaves
-- (a failed order keeps its key; the units of one that is released come
-- back, which publishes a stock event): the set read here stays exact until
-- the next stock event of the sale.
--
-- KEYS[1] meta, KEYS[2] recovering (see reserve.lua; the user entries are in
-- the sale's buckets, record.lua)
-- ARGV[1] the most keys the caller keeps
--
-- Returns
--   {"keys", user, index, user, index, ...}  sold out; each user that
--                                            reserved with a key, and the key
--                                            index of its entry ("\n<key>\t<order id>" each)
--   {"open"}                                 units are left
--   {"not_found"}                            the sale is not in Redis
--   {"recovering"}                           rebuilt after a Redis loss: keys
--                                            of orders queued before it may be missing
--   {"sharded"}                              a sale of several stock shards
--                                            (its keys are spread over slots)
--   {"too_many"}                             more than ARGV[1] keys

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
local most = tonumber(ARGV[1])
local out, n = {'keys'}, 0
for _, users in ipairs(sale_hashes(KEYS[1], tonumber(meta[4]), 'u')) do
  local all = redis.call('HGETALL', users)
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
