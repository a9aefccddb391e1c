-- move_in.lua: the second step of a move between stock shards (see
-- move_out.lua): the recipient adds the units of the donor's move seq, once.
--
-- KEYS[1] the recipient shard's meta
-- ARGV[1] the donor's shard index, ARGV[2] seq, ARGV[3] units
--
-- Nothing is published: the units were sellable on the donor already, and
-- no one was told sold out meanwhile (that answer needs every shard empty).
--
-- Returns {"applied"} (added now), {"already"} (seq was applied before:
-- nothing changed) or {"missing"} (no such shard in Redis: nothing changed;
-- the move stays in flight for the reconciler, which rebuilds the shard).

if redis.call('HEXISTS', KEYS[1], 'total') == 0 then
  return {'missing'}
end
local f = 'mi:' .. ARGV[1]
local seq = tonumber(ARGV[2])
if seq <= (tonumber(redis.call('HGET', KEYS[1], f)) or 0) then
  return {'already'}
end
redis.call('HINCRBY', KEYS[1], 'total', tonumber(ARGV[3]))
redis.call('HINCRBY', KEYS[1], 'mv', 1)
redis.call('HSET', KEYS[1], f, seq)
return {'applied'}
