-- pass.lua: a consumer passed a copy of a sale's drain marker: it decided
-- every delivery it received before the copy. The sale's recovery may end
-- once, in every partition, every live consumer (consumers.lua) passed a
-- copy published in the partition's current round: the queue delivered
-- every order queued before the copy ahead of it, to some consumer, and
-- each consumer that could hold one has since decided what it received
-- before its copy. A consumer that left gave its unacked deliveries back
-- to the queue, where they may be behind a copy that was passed already:
-- that starts a new round, and only copies published after it count.
--
-- One copy per partition and round goes round: copies multiply (every
-- backend whose purchase meets the recovery sends the marker again after
-- reservation_ttl), and each one a consumer passed already costs it a
-- pause. The first copy passed in a round is elected ("~live", renewed at
-- each pass); any other is dropped, unless the elected one was not seen for
-- the takeover time (dead-lettered, lost with its queue): then it takes over.
--
-- KEYS[1..P] registry hashes of partitions 0..P-1, KEYS[P+1..2P] the passes
-- of this recovery's marker per partition (one hash tag for all). A passes
-- hash: "~round" -> the round its passes belong to, "~live" and "~seen" ->
-- the elected copy and when it was last passed (ms), consumer id -> 1.
-- ARGV[1] the caller's partition (0-based), ARGV[2] its consumer id,
-- ARGV[3] the copy's round, ARGV[4] the age a registry must have (ms) for
-- its entries to be complete, ARGV[5] ttl of the passes (ms), ARGV[6] the
-- copy's id ("" for the backend's), ARGV[7] an id for the copy if it is
-- elected now, ARGV[8] the takeover time (ms)
--
-- Returns
--   {"unregistered"}          the caller has no live entry: nothing recorded
--   {"stale", round}          the copy is of an earlier round (or the
--                             backend's): nothing recorded; send it round
--                             again with round
--   {"waiting", round, again, copy}
--                             recorded; some consumer has not passed yet;
--                             again = 1 when the caller had passed before;
--                             send the copy round again with id copy
--   {"drop"}                  recorded; another copy goes round: ack this one
--   {"done"}                  every live consumer of every partition passed

local p = #KEYS / 2
local own, id, copy = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local age, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local copy_id, new_id, takeover = ARGV[6], ARGV[7], tonumber(ARGV[8])
if p < 1 or p % 1 ~= 0 or not own or own < 0 or own >= p or not id or id == '' or not copy
    or not age or not ttl or ttl <= 0 or not copy_id or not new_id or new_id == '' or not takeover then
  return redis.error_reply('pass.lua: bad arguments')
end
own = own + 1
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local lives = {}
for i = 1, p do
  lives[i] = consumers_live(KEYS[i], now)
end
if not lives[own][id] then
  return {'unregistered'}
end
local round = consumers_round(KEYS[own])
if copy ~= round then
  return {'stale', round}
end
local passes = KEYS[p + own]
if redis.call('HGET', passes, '~round') ~= round then
  redis.call('DEL', passes)
  redis.call('HSET', passes, '~round', round)
end
local again = redis.call('HSETNX', passes, id, 1) == 0 and 1 or 0
redis.call('PEXPIRE', passes, ttl)

-- waiting decides which copy goes on.
local function waiting()
  local live = redis.call('HMGET', passes, '~live', '~seen')
  if live[1] and live[1] == copy_id then
    redis.call('HSET', passes, '~seen', now)
    return {'waiting', round, again, copy_id}
  end
  if live[1] and now - tonumber(live[2]) <= takeover then
    return {'drop'}
  end
  redis.call('HSET', passes, '~live', new_id, '~seen', now)
  return {'waiting', round, again, new_id}
end

for i = 1, p do
  local since = tonumber(redis.call('HGET', KEYS[i], '~since'))
  if not since or now - since < age then
    return waiting()
  end
  if redis.call('HGET', KEYS[p + i], '~round') ~= consumers_round(KEYS[i]) then
    return waiting()
  end
  local any = false
  for c in pairs(lives[i]) do
    if redis.call('HEXISTS', KEYS[p + i], c) == 0 then
      return waiting()
    end
    any = true
  end
  if not any then
    return waiting()
  end
end
return {'done'}
