-- release.lua: give a pending reservation back and mark its order failed.
-- Used by the backend when a publish failed (nack, return, timeout, lost
-- connection) and by the sweeper. Only a reservation still in state P moves:
-- once a worker has claimed it (C) the worker's MySQL commit decides, so an
-- order is never both released and confirmed.
--
-- KEYS[1] meta, KEYS[2] users, KEYS[3] orders, KEYS[4] deadlines (see reserve.lua)
-- KEYS[5] idem (optional; the backend, whose client never learnt the order)
-- ARGV[1] order id, ARGV[2] reason, ARGV[3] pub/sub channel, ARGV[4] activity id
-- ARGV[5] "user:key" idempotency field (optional, with KEYS[5]): when the order
--         is released, the field is deleted if it still names this order, so a
--         client told "503, nothing kept" may retry with the same key
-- ARGV[6] user id (optional): the backend's undo of a reserve whose outcome it
--         does not know. With no record, a tombstone "F|0|user||reason" is
--         written, which a reserve.lua of this order id arriving later refuses
--         ("undone"); the undo then answers "released" too.
--
-- Returns {"released"} | {"claimed"} | {"queued"} | {"confirmed"} | {"failed"} | {"missing"}
-- (all but the first: nothing changed, the state the order is in; "queued":
-- pending, but the broker confirmed a message of it — another request of the
-- same key published it — so a worker will decide it, as after a claim). A repeat of a
-- release that already happened with the same reason answers "released" again,
-- so a caller whose first reply was lost (a timeout) may simply retry.

local rec = redis.call('HGET', KEYS[3], ARGV[1])
if not rec then
  if ARGV[6] and ARGV[6] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[1], 'F|0|' .. ARGV[6] .. '||' .. ARGV[2])
    return {'released'}
  end
  return {'missing'}
end
local state, qty, user, deadline, reason = string.match(rec, '^(%a)|(%d+)|([^|]*)|(%d*)|(.*)$')
if state == 'F' and reason == ARGV[2] then
  return {'released'}
end
if state == 'C' then
  return {'claimed'}
elseif state == 'P' and reason == 'q' then
  return {'queued'}
elseif state == 'K' then
  return {'confirmed'}
elseif state == 'F' then
  return {'failed'}
end
qty = tonumber(qty)
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'pending', -qty)
end
if tonumber(redis.call('HINCRBY', KEYS[2], user, -qty)) <= 0 then
  redis.call('HDEL', KEYS[2], user)
end
redis.call('HSET', KEYS[3], ARGV[1], 'F|' .. qty .. '|' .. user .. '|' .. deadline .. '|' .. ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[1])
if KEYS[5] and ARGV[5] and ARGV[5] ~= '' then
  if redis.call('HGET', KEYS[5], ARGV[5]) == ARGV[1] then
    redis.call('HDEL', KEYS[5], ARGV[5])
  end
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {'released'}
