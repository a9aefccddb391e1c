-- room_lib.lua: the waiting room's shared pieces, put before room_enter.lua
-- and room_tick.lua. Keys of one room (all under one hash tag
-- {room:<rule>:<activity>}): meta (hash: next, served, tokens, last,
-- opened, bought: purchases of admitted clients answered 202), ids (hash identity -> place), places (hash place ->
-- "<arrival_ms>|<identity>", places not decided yet), seen (hash identity
-- -> last poll ms), pre (zset identity -> random score: the pre-queue),
-- active (zset identity -> admission deadline ms: admitted, not done),
-- admitted (hash identity -> "<arrival_ms>|<place>" of its admission, so an
-- admitted client that lost its ticket still learns when it arrived).

local function room_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- room_open gives the pre-queue its places in the order of its random
-- scores (drawn by the instances at arrival), so that how early a client
-- came before the opening gains nothing, then marks the room open.
local function room_open(meta, ids, places, seen, pre, now)
  local ms = redis.call('ZRANGE', pre, 0, -1)
  for _, id in ipairs(ms) do
    local p = redis.call('HINCRBY', meta, 'next', 1)
    redis.call('HSET', ids, id, p)
    redis.call('HSET', places, p, now .. '|' .. id)
    -- Its own last poll stays: a holder gone before the opening is
    -- skipped as soon as place_ttl has passed since then.
    redis.call('HSETNX', seen, id, now)
  end
  redis.call('DEL', pre)
  redis.call('HSET', meta, 'opened', 1, 'last', now)
end
