-- queued.lua: note on a reservation record that the broker confirmed its
-- order message, so that the sweeper knows the message is safe in the queue
-- and never expires the order while it waits there (a worker outage).
--
-- KEYS[1] meta (see reserve.lua; the record is in the sale's buckets, record.lua)
-- ARGV[1] order id
--
-- Returns 1 when the record is now marked ("q"; only a P or C record is
-- marked), 0 when the record is missing or already settled (nothing changed).

local orders = order_key(KEYS[1], sale_buckets(KEYS[1]), ARGV[1])
local rec = redis.call('HGET', orders, ARGV[1])
if not rec then
  return 0
end
local state, qty, user, deadline = rec_parse(rec)
if (state ~= 'P' and state ~= 'C') or not deadline then
  return 0
end
redis.call('HSET', orders, ARGV[1], rec_open(state, qty, user, deadline, 'q'))
return 1
