-- release.lua: give a pending reservation back and mark its order failed.
-- Used by the backend when a publish failed (nack, return, timeout, lost
-- connection) and by the sweeper. Only a reservation still in state P moves:
-- once a worker has claimed it (C) the worker's MySQL commit decides, so an
-- order is never both released and confirmed.
--
-- KEYS[1] meta, KEYS[2] users, KEYS[3] orders, KEYS[4] deadlines (see reserve.lua)
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

local rec = redis.call('HGET', KEYS[3], ARGV[1])
if not rec then
  if ARGV[6] and ARGV[6] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[1], rec_done('F', 0, ARGV[6], ARGV[2]))
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
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'pending', -qty)
end
local held, index = user_get(KEYS[2], user)
if ARGV[5] and ARGV[5] ~= '' then
  index = key_drop(index, ARGV[5], ARGV[1])
end
user_put(KEYS[2], user, held - qty, index)
redis.call('HSET', KEYS[3], ARGV[1], rec_done('F', qty, user, ARGV[2]))
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {'released'}
