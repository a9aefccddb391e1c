-- queued.lua: note on a reservation record that the broker confirmed its
-- order message, so that the sweeper knows the message is safe in the queue
-- and never expires the order while it waits there (a worker outage).
--
-- KEYS[1] orders (see reserve.lua)
-- ARGV[1] order id
--
-- Returns 1 when the record is now marked ("q"; only a P or C record is
-- marked), 0 when the record is missing or already settled (nothing changed).

local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then
  return 0
end
local state, qty, user, deadline = rec_parse(rec)
if (state ~= 'P' and state ~= 'C') or not deadline then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], rec_open(state, qty, user, deadline, 'q'))
return 1
