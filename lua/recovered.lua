-- recovered.lua: end the recovery of a sale rebuilt after a Redis loss, once a
-- worker consumed the drain marker published after the rebuild (every order
-- queued before it is then decided in MySQL and its key back in Redis).
--
-- KEYS[1] recovering (see reserve.lua)
-- ARGV[1] the marker's recovery token
--
-- Returns 1 when the recovery ended now, 0 when the sale is not recovering
-- under this token (ended already, or a later loss started a new recovery,
-- which only its own marker ends).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
