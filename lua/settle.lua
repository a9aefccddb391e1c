-- settle.lua: after the worker's MySQL commit, apply each order's outcome to
-- Redis. Idempotent: an order already settled (K or F) changes nothing, so a
-- redelivered batch is harmless.
--
-- KEYS[1] meta, KEYS[2] deadlines (see reserve.lua; records and user entries
-- are in the sale's buckets, record.lua)
-- ARGV[1] stock-event channel, ARGV[2] activity id, ARGV[3] order-event
-- channel, then five values per order:
--   order id, outcome ("K" confirmed | "F" failed), reason, quantity, user id
--
-- A settled record drops its deadline and mark (see record.lua).
-- Returns the number of orders whose state changed. Those orders are
-- PUBLISHed once on the order-event channel, one "id|outcome|reason" line
-- each, so that backends wake the clients waiting for them.
-- A record that Redis lost (restart, flush) is written back in its final state;
-- the counters then follow MySQL's outcome, and the reconciler repairs any drift
-- in the safe direction (Redis may lag, never lead). A missing meta hash is
-- never created here: only warm.lua builds a sale. An archived sale (its
-- summary only, see archive.lua) changes nothing: MySQL answers for its
-- orders, and a late redelivery must not bring records or counters back.

if redis.call('HEXISTS', KEYS[1], 'archived') == 1 then
  return 0
end
local has_meta = redis.call('HEXISTS', KEYS[1], 'total') == 1
local nb = sale_buckets(KEYS[1])
local changed, gave_back, settled = 0, false, {}
for i = 4, #ARGV, 5 do
  local oid, outcome, reason = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local qty, user = tonumber(ARGV[i + 3]), ARGV[i + 4]
  local orders = order_key(KEYS[1], nb, oid)
  local rec = redis.call('HGET', orders, oid)
  local state
  if rec then
    local s, q, u = rec_parse(rec)
    if s then
      state, qty, user = s, q, u
    end
  end
  if state == 'P' or state == 'C' then
    if has_meta then
      redis.call('HINCRBY', KEYS[1], 'pending', -qty)
      if outcome == 'K' then
        redis.call('HINCRBY', KEYS[1], 'sold', qty)
      end
    end
    if outcome ~= 'K' then
      local users = user_key(KEYS[1], nb, user)
      local held, index = user_get(users, user)
      user_put(users, user, held - qty, index)
      gave_back = true
    end
  elseif state == nil and has_meta and outcome == 'K' then
    redis.call('HINCRBY', KEYS[1], 'sold', qty)
    local users = user_key(KEYS[1], nb, user)
    local held, index = user_get(users, user)
    user_put(users, user, held + qty, index)
  end
  if state ~= 'K' and state ~= 'F' then
    redis.call('HSET', orders, oid, rec_done(outcome, qty, user, reason))
    redis.call('ZREM', KEYS[2], oid)
    changed = changed + 1
    settled[changed] = oid .. '|' .. outcome .. '|' .. reason
  end
end
if changed > 0 then
  redis.call('PUBLISH', ARGV[3], table.concat(settled, '\n'))
end
if gave_back then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return changed
