-- queued.lua: note on reservation records that the broker confirmed their
-- order messages, so that the sweeper knows each message is safe in the queue
-- and never expires the order while it waits there (a worker outage).
--
-- KEYS[1] meta (see reserve.lua; the records are in the sale's buckets, record.lua)
-- ARGV order ids, one or more, all of this shard (a group's message: one
-- call, not one per order)
--
-- Returns one integer per order id, in order: 1 when the record is now
-- marked ("q"; only a P or C record is marked), 0 when the record is missing
-- or already settled (nothing changed).

local buckets = sale_buckets(KEYS[1])
local out = {}
for i = 1, #ARGV do
  local orders = order_key(KEYS[1], buckets, ARGV[i])
  local rec = redis.call('HGET', orders, ARGV[i])
  out[i] = 0
  if rec then
    local state, qty, user, deadline = rec_parse(rec)
    if (state == 'P' or state == 'C') and deadline then
      redis.call('HSET', orders, ARGV[i], rec_open(state, qty, user, deadline, 'q'))
      out[i] = 1
    end
  end
end
return out
