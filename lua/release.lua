-- release.lua: give a pending reservation back and mark its order failed.
-- Used by the backend when a publish failed (nack, return, timeout, lost
-- connection) and by the sweeper. Only a reservation still in state P moves:
-- once a worker has claimed it (C) the worker's MySQL commit decides, so an
-- order is never both released and confirmed.
--
-- KEYS[1] meta, KEYS[2] deadlines (see reserve.lua; the order's record and its
-- user's entry are in the sale's buckets, record.lua)
-- ARGV[1] order id, ARGV[2] reason, ARGV[3] pub/sub channel, ARGV[4] activity id
-- ARGV[5] idempotency key (optional; the backend, whose client never learnt the
--         order): when the order is released, the key leaves the user's entry
--         if it still names this order, so a client told "503, nothing kept"
--         may retry with the same key
-- ARGV[6] user id (optional): the backend's undo of a reserve whose outcome it
--         does not know. With no record, a tombstone "F0|user|reason" is
--         written, which a reserve.lua of this order id arriving later refuses
--         ("undone"); the undo then answers "released" too. And a P record
--         marked adopted ("a": a keyed replay publishes it) is left alone:
--         "taken" — a client was or will be answered 202 with that order id.
--
-- Returns {"released"} | {"claimed"} | {"queued"} | {"confirmed"} | {"failed"} | {"missing"}
-- | {"taken"} (all but the first: nothing changed, the state the order is in;
-- "queued": pending, but the broker confirmed a message of it — another
-- request of the same key published it — so a worker will decide it, as
-- after a claim; "taken": the backend's undo met a record a replay adopted). A repeat of a
-- release that already happened with the same reason answers "released" again,
-- so a caller whose first reply was lost (a timeout) may simply retry.

local nb = sale_buckets(KEYS[1])
local orders = order_key(KEYS[1], nb, ARGV[1])
local rec = redis.call('HGET', orders, ARGV[1])
if not rec then
  if ARGV[6] and ARGV[6] ~= '' then
    -- With no sale in Redis (no buckets) the tombstone goes to the
    -- unbucketed hash, which warm.lua moves into the buckets it creates.
    redis.call('HSET', orders, ARGV[1], rec_done('F', 0, ARGV[6], ARGV[2]))
    return {'released'}
  end
  return {'missing'}
end
local state, qty, user, _, tail = rec_parse(rec)
if state == 'F' and tail == ARGV[2] then
  return {'released'}
end
if state == 'C' then
  return {'claimed'}
elseif state == 'P' and tail == 'q' then
  return {'queued'}
elseif state == 'K' then
  return {'confirmed'}
elseif state == 'F' then
  return {'failed'}
end
if ARGV[6] and ARGV[6] ~= '' and tail == 'a' then
  return {'taken'}
end
if redis.call('HEXISTS', KEYS[1], 'total') == 1 then
  redis.call('HINCRBY', KEYS[1], 'pending', -qty)
end
local users = user_key(KEYS[1], nb, user)
local held, index = user_get(users, user)
if ARGV[5] and ARGV[5] ~= '' then
  index = key_drop(index, ARGV[5], ARGV[1])
end
user_put(users, user, held - qty, index)
redis.call('HSET', orders, ARGV[1], rec_done('F', qty, user, ARGV[2]))
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {'released'}
