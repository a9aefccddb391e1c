-- consumers.lua: the registry of the live consumers of order-queue
-- partitions, which a sale's drain marker must pass before its recovery
-- ends (see pass.lua). A consumer registers before it subscribes and
-- refreshes its entry well within ttl; one that stops drops its entry once
-- its channel is closed (its unacked deliveries went back to the queue); an
-- entry not refreshed expires. An entry that leaves (dropped or expired)
-- starts a new round of the queue: a copy of a marker published before it
-- may be ahead of orders the leaver gave back, so passes of that copy no
-- longer count.
--
-- KEYS[i] the registry hash of one queue (all under one hash tag). Fields:
-- a consumer id -> its expiry (ms, Redis TIME), "~since" -> when the hash
-- was created (a Redis that lost it knows nobody until each live consumer
-- has refreshed: pass.lua waits for the hash to be old enough), "~removed"
-- -> entries that left.
-- ARGV[1] ttl ms (0: drop), ARGV[1 + i] the consumer id for KEYS[i]
--
-- Returns, per key, the queue's round ("<since>.<removed>") after the call.

local ttl = tonumber(ARGV[1])
if not ttl or ttl < 0 or #ARGV ~= #KEYS + 1 then
  return redis.error_reply('consumers.lua: want a ttl and one consumer id per key')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, reg in ipairs(KEYS) do
  local id = ARGV[1 + i]
  if ttl > 0 then
    redis.call('HSETNX', reg, '~since', now)
    consumers_live(reg, now)
    redis.call('HSET', reg, id, now + ttl)
    -- The hash outlives every entry; a registry nobody refreshes goes.
    redis.call('PEXPIRE', reg, 10 * ttl)
  elseif redis.call('HDEL', reg, id) == 1 then
    redis.call('HINCRBY', reg, '~removed', 1)
  end
  out[i] = consumers_round(reg)
end
return out
