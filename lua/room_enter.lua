-- room_enter.lua: a client arrives at (or comes back to) a waiting room:
-- it gets its identity's place, a new one at the back, or its admission.
-- One place per identity: an identity whose place is still in line gets it
-- back (and counts as having polled); one whose place the line passed
-- (admitted and done, or skipped as abandoned) gets a new place at the back.
-- Before the opening an arrival joins the pre-queue (place 0); the first
-- call at or after the opening opens the room (room_lib.lua).
--
-- KEYS   meta, ids, places, seen, pre, active, admitted (room_lib.lua)
-- ARGV   identity, opens_ms (0: open now), pre-queue score (random),
--        keep_ms (the room's keys expire this long after the last write)
-- Returns {kind, place, arrival_ms, deadline_ms, served, now_ms}: kind "A"
--   admitted (deadline_ms: its admission's end; place and arrival_ms of
--   the place it was admitted from), "W" waiting in line at
--   place (arrival_ms: when it got the place), "P" in the pre-queue.

local meta, ids, places, seen, pre, active, admitted = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, opens, score, keep = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local now = room_now()
local served = tonumber(redis.call('HGET', meta, 'served') or '0')

local dl = redis.call('ZSCORE', active, id)
if dl and tonumber(dl) > now then
  local arr, p = 0, tonumber(redis.call('HGET', ids, id) or '0')
  local rec = redis.call('HGET', admitted, id)
  if rec then
    local a, q = string.match(rec, '^(%d+)|(%d+)$')
    arr, p = tonumber(a), tonumber(q)
  end
  return {'A', p, arr, tonumber(dl), served, now}
end

local function waiting(p)
  redis.call('HSET', seen, id, now)
  local rec = redis.call('HGET', places, p)
  local arr = now
  if rec then arr = tonumber(string.match(rec, '^(%d+)|')) end
  return {'W', p, arr, 0, served, now}
end

local p = tonumber(redis.call('HGET', ids, id) or '0')
if p > served then
  return waiting(p)
end

if redis.call('HGET', meta, 'opened') ~= '1' then
  if opens > now then
    redis.call('ZADD', pre, 'NX', score, id)
    redis.call('HSET', seen, id, now)
    for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, keep) end
    return {'P', 0, 0, 0, served, now}
  end
  room_open(meta, ids, places, seen, pre, now)
  p = tonumber(redis.call('HGET', ids, id) or '0')
  if p > served then
    return waiting(p)
  end
end

p = redis.call('HINCRBY', meta, 'next', 1)
redis.call('HSET', ids, id, p)
redis.call('HDEL', admitted, id)
redis.call('HSET', places, p, now .. '|' .. id)
redis.call('HSET', seen, id, now)
for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, keep) end
return {'W', p, now, 0, served, now}
