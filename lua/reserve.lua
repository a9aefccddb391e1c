-- reserve.lua: check and reserve units of one activity in one atomic step.
--
-- KEYS[1] meta       hash  total, sold, pending, limit, start, end (unix ms)
--                          and buckets (their count, see record.lua)
-- KEYS[2] deadlines  zset  order id -> deadline (ms) while pending or claimed
-- KEYS[3] recovering string, the recovery token, set while a sale rebuilt after
--                          a Redis loss may still have orders in the queue that
--                          Redis forgot (their keys, their units): a key Redis does
--                          not know, and every new reservation, then answers "unsure"
-- KEYS[4] the bucket of the order's record, KEYS[5] the bucket of the user's
--                          entry (units held, idempotency keys -> order ids),
--                          for a sale of ARGV[6] buckets (record.lua has the
--                          names and the encodings): the caller names them, so
--                          the hot path hashes nothing in Lua
-- (A keyed replay reads its earlier order's record from the bucket the
-- script names itself: not in KEYS, but of the sale's hash tag, so on Redis
-- Cluster in the slot of KEYS.)
-- ARGV[1] user id, ARGV[2] idempotency key ("" for none), ARGV[3] quantity,
-- ARGV[4] order id, chosen by the caller before the call, ARGV[5] reservation
-- TTL in ms, ARGV[6] the sale's bucket count the caller named KEYS[4] and
-- KEYS[5] for (0: unbucketed), ARGV[7] the sale's stock shards the caller
-- chose this shard (and the order id) for (absent: 1)
--
-- Idempotent on the request: the caller picks the order id first, so a
-- repeat of the same call (a lost reply, a client-side retry) finds its own
-- record and answers "ok" again without reserving twice; and once the
-- caller's undo (release.lua) has left a tombstone under that id, a reserve
-- that arrives late (delayed on the network) is refused with "undone".
--
-- Returns a table whose first element is the outcome:
--   {"ok", order_id, deadline_ms}            reserved (now, or by an earlier run of this call;
--                                            deadline 0 when that order is settled already)
--   {"undone", reason}                       the caller's undo ran first: nothing reserved, ever
--   {"replay", order_id, state, qty, deadline_ms, queued}
--                                            the key was used before; nothing reserved.
--                                            queued is 1 once the broker confirmed its message
--                                            (mark "q" while P or C); a P record not queued
--                                            is marked adopted ("a"): the replay publishes it,
--                                            and the backend's undo of the attempt that
--                                            reserved it answers "taken"
--   {"not_found"}                            no sale in Redis (unknown or keys lost)
--   {"buckets", n}                           the sale has n buckets, not ARGV[6]: nothing
--                                            read or written; call again with KEYS for n
--   {"shards", k}                            the sale has k stock shards, not ARGV[7]:
--                                            nothing read or written; the user's home
--                                            shard (and its order id) is chosen anew
--   {"unsure", token}                        while recovering, a request that would reserve:
--                                            its key may belong to an order still in the
--                                            queue, and the units of those orders are not
--                                            counted in pending; nothing reserved
--   {"bad_quantity", limit}                  quantity outside 1..limit
--   {"not_started", start_ms} | {"ended", end_ms}
--   {"limit_exceeded", held, limit}
--   {"sold_out"}                             no unit is left to sell
--   {"insufficient", available}              units are left, fewer than asked
--   {"conflict"}                             order id used by another user
-- State letters: P pending, C claimed by a worker, K confirmed, F failed.
-- All keys share the {act:ID} hash tag; TIME is the only clock; nothing is
-- written before every check has passed.

local meta = redis.call('HMGET', KEYS[1], 'total', 'sold', 'pending', 'limit', 'start', 'end', 'buckets', 'shards')
if not meta[1] then
  return {'not_found'}
end
if (tonumber(meta[8]) or 1) ~= (tonumber(ARGV[7]) or 1) then
  return {'shards', tonumber(meta[8]) or 1}
end
local user, key, oid = ARGV[1], ARGV[2], ARGV[4]
local nb = tonumber(meta[7])
if (nb or 0) ~= tonumber(ARGV[6]) then
  return {'buckets', nb or 0}
end
local orders, users = KEYS[4], KEYS[5]
local mine = redis.call('HGET', orders, oid)
if mine then
  local state, _, owner, deadline, reason = rec_parse(mine)
  if owner ~= user then
    return {'conflict'}
  end
  if state == 'F' then
    return {'undone', reason}
  end
  return {'ok', oid, deadline or 0}
end
local held, index = user_get(users, user)
if key ~= '' then
  local prior = key_find(index, key)
  if prior then
    local prior_orders = order_key(KEYS[1], nb, prior)
    local rec = redis.call('HGET', prior_orders, prior)
    if rec then
      local state, qty, _, deadline, mark = rec_parse(rec)
      local queued = 0
      if mark == 'q' and (state == 'P' or state == 'C') then
        queued = 1
      elseif state == 'P' and mark == '' then
        -- Adopted: this replay publishes the order itself, so the undo of
        -- the attempt that reserved it may no longer release it.
        redis.call('HSET', prior_orders, prior, rec_open(state, qty, user, deadline, 'a'))
      end
      return {'replay', prior, state, qty, deadline or 0, queued}
    end
    return {'replay', prior, '?', 0, 0, 0}
  end
end
local qty = tonumber(ARGV[3])
local total, sold, pending = tonumber(meta[1]), tonumber(meta[2]), tonumber(meta[3])
local limit, start_ms, end_ms = tonumber(meta[4]), tonumber(meta[5]), tonumber(meta[6])
if not qty or qty < 1 or qty > limit or qty ~= math.floor(qty) then
  return {'bad_quantity', limit}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < start_ms then
  return {'not_started', start_ms}
end
if now >= end_ms then
  return {'ended', end_ms}
end
local recovering = redis.call('GET', KEYS[3])
if recovering then
  return {'unsure', recovering}
end
if held + qty > limit then
  return {'limit_exceeded', held, limit}
end
local available = total - sold - pending
if available <= 0 then
  return {'sold_out'}
end
if available < qty then
  return {'insufficient', available}
end
local deadline = now + tonumber(ARGV[5])
redis.call('HINCRBY', KEYS[1], 'pending', qty)
if key ~= '' then
  index = index .. '\n' .. key .. '\t' .. oid
end
user_put(users, user, held + qty, index)
redis.call('HSET', orders, oid, rec_open('P', qty, user, deadline, ''))
redis.call('ZADD', KEYS[2], deadline, oid)
return {'ok', oid, deadline}
