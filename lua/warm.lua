-- warm.lua: create or update a sale in Redis from MySQL, the truth.
-- Safe to repeat and safe while the sale runs: counters of a live sale
-- (sold, pending, users) are kept, only its settings change.
--
-- KEYS[1] meta, KEYS[2] users (see reserve.lua)
-- ARGV[1] total stock, ARGV[2] per-user limit, ARGV[3] start ms, ARGV[4] end ms,
-- ARGV[5] units sold in MySQL, ARGV[6] "1" when user totals follow, else "0",
-- ARGV[7] pub/sub channel, ARGV[8] activity id,
-- ARGV[9..] user id, units pairs (MySQL's per-user totals) when ARGV[6] is "1"
--
-- Returns
--   {"updated"}                    settings of a live sale changed
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
local cur = redis.call('HMGET', KEYS[1], 'total', 'sold', 'pending')
if cur[1] then
  local rsold, rpending = tonumber(cur[2]), tonumber(cur[3])
  if total < rsold + rpending then
    return {'conflict', rsold, rpending}
  end
  redis.call('HSET', KEYS[1], 'total', total, 'limit', limit, 'start', start_ms, 'end', end_ms)
  if total > tonumber(cur[1]) then
    redis.call('PUBLISH', ARGV[7], ARGV[8])
  end
  return {'updated'}
end
if sold > 0 and ARGV[6] ~= '1' then
  return {'need_users'}
end
if sold > total then
  return {'conflict', sold, 0}
end
redis.call('DEL', KEYS[2])
for i = 9, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'total', total, 'sold', sold, 'pending', 0,
  'limit', limit, 'start', start_ms, 'end', end_ms)
redis.call('PUBLISH', ARGV[7], ARGV[8])
return {'created'}
