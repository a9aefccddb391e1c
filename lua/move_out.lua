-- move_out.lua: the first step of moving units between two stock shards of
-- one sale (a buyer's home shard is empty while others hold units): the
-- donor gives up n units of its total and records the move, in one step.
-- move_in.lua on the recipient adds them, once; move_done.lua then clears the
-- record. A process that dies between the steps leaves the record, and
-- whoever meets it next (the next mover of the pair, the reconciler)
-- completes the move: no unit is lost or made (reservation.Store.Rebalance).
--
-- KEYS[1] the donor shard's meta, KEYS[2] its recovering mark (reserve.lua)
-- ARGV[1] the recipient's shard index, ARGV[2] units the recipient needs at
-- least (it gets at least that many if the donor has them, and up to half of
-- the donor's available units: a hot shard asks less often)
--
-- Meta fields of the protocol, per recipient r: "mo:<r>" = "<seq>:<n>" the
-- move in flight (at most one per ordered pair), "ms:<r>" the last seq issued
-- to r; on the recipient, "mi:<d>" the last seq applied from donor d. "mv"
-- counts every move step a shard took part in (out here, in by move_in.lua,
-- the record's clearing by move_done.lua): two
-- equal reads of it bracket a time no move touched the shard, which is how a
-- buyer tells a sale truly sold out from units in motion (Store.Reserve).
--
-- Returns
--   {"moved", seq, n}     n units taken off the donor, now in flight to r
--   {"pending", seq, n}   a move to r is in flight already: complete it first
--   {"empty", mv}         the donor has no unit to give (or is missing, or
--                         recovering: its pending may be undercounted); mv
--                         is its move count

local m = redis.call('HMGET', KEYS[1], 'total', 'sold', 'pending', 'mo:' .. ARGV[1], 'mv')
local mv = tonumber(m[5]) or 0
if not m[1] then
  return {'empty', -1}
end
if m[4] then
  local seq, n = string.match(m[4], '^(%d+):(%d+)$')
  return {'pending', tonumber(seq), tonumber(n)}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'empty', mv}
end
local available = tonumber(m[1]) - tonumber(m[2]) - tonumber(m[3])
if available <= 0 then
  return {'empty', mv}
end
local n = math.min(available, math.max(tonumber(ARGV[2]), math.floor(available / 2)))
redis.call('HINCRBY', KEYS[1], 'total', -n)
redis.call('HINCRBY', KEYS[1], 'mv', 1)
local seq = redis.call('HINCRBY', KEYS[1], 'ms:' .. ARGV[1], 1)
redis.call('HSET', KEYS[1], 'mo:' .. ARGV[1], seq .. ':' .. n)
return {'moved', seq, n}
