-- move_done.lua: the last step of a move between stock shards (see
-- move_out.lua): the donor clears its record of the move, once the
-- recipient applied it.
--
-- KEYS[1] the donor shard's meta
-- ARGV[1] the recipient's shard index, ARGV[2] the record ("<seq>:<n>")
--
-- Returns 1 when cleared, 0 when the record is another (or gone already).

local f = 'mo:' .. ARGV[1]
if redis.call('HGET', KEYS[1], f) == ARGV[2] then
  redis.call('HDEL', KEYS[1], f)
  return 1
end
return 0
