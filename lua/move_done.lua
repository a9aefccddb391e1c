-- move_done.lua: the last step of a move between stock shards (see
-- move_out.lua): the donor clears its record of the move, once the
-- recipient applied it. It counts in the donor's "mv" like the other two
-- steps: a buyer deciding sold out reads every shard twice and trusts only
-- shards no step touched in between; without the count, a record cleared
-- between the reads would hide that its units reached the recipient after
-- the recipient's own second read (Store.soldOut).
--
-- KEYS[1] the donor shard's meta
-- ARGV[1] the recipient's shard index, ARGV[2] the record ("<seq>:<n>")
--
-- Returns 1 when cleared, 0 when the record is another (or gone already).

local f = 'mo:' .. ARGV[1]
if redis.call('HGET', KEYS[1], f) == ARGV[2] then
  redis.call('HDEL', KEYS[1], f)
  redis.call('HINCRBY', KEYS[1], 'mv', 1)
  return 1
end
return 0
