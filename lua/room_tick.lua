-- room_tick.lua: one instance's periodic step of a waiting room (every
-- instance runs it; each call moves the shared line by what the time since
-- the last call, of any instance, allows).
--
-- 1. The polls this instance saw since its last call mark their holders
--    seen (a place not seen for place_ttl is abandoned).
-- 2. Admissions past their deadline end (their slots free).
-- 3. At or after opens_ms, a room not open yet opens (room_lib.lua).
-- 4. The serving counter moves: a token bucket (rate per second, at most
--    burst) pays one token per admission; places are decided in order,
--    each admitted (active, deadline now + session) when a token and a
--    slot are free, or skipped when its holder has not polled within
--    place_ttl (that costs no token: the line never waits for it). Slots:
--    min(max_active, units_left + margin) minus the active admissions,
--    none when units_left is 0; units_left -1 means no stock is known
--    (max_active alone caps).
--
-- KEYS   meta, ids, places, seen, pre, active, admitted (room_lib.lua)
-- ARGV   rate (admissions/s), burst, max_active, units_left (-1: unknown),
--        margin, place_ttl_ms, session_ms, opens_ms (0: now), max_steps,
--        keep_ms, bought_base (-1: none), then the identities seen polling
-- Returns {served, next, active, admitted, skipped, expired, now_ms, opened,
--   pre, bought}: admitted, skipped, expired are this call's own.

local meta, ids, places, seen, pre, active, admitted = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_active, units, margin = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local place_ttl, session, opens = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local max_steps, keep, bought_base = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local now = room_now()

for i = 12, #ARGV do
  redis.call('HSET', seen, ARGV[i], now)
end

local expired = redis.call('ZREMRANGEBYSCORE', active, '-inf', now)

local opened = redis.call('HGET', meta, 'opened') == '1'
if not opened and opens <= now then
  room_open(meta, ids, places, seen, pre, now)
  opened = true
end

local n_admitted, n_skipped = 0, 0
local m = redis.call('HMGET', meta, 'served', 'next', 'tokens', 'last', 'bought')
local served, nxt = tonumber(m[1] or '0'), tonumber(m[2] or '0')
local bought = tonumber(m[5] or '0')
if units > 0 and bought_base >= 0 then units = math.max(units - (bought - bought_base), 0) end
if opened then
  local tokens, last = tonumber(m[3] or '0'), tonumber(m[4] or now)
  if now > last then
    tokens = math.min(burst, tokens + (now - last) * rate / 1000)
  end
  local cap = max_active
  -- No unit left: nobody more, margin or not (it is for no-shows among
  -- admitted clients while units remain).
  if units == 0 then cap = 0 elseif units > 0 then cap = math.min(cap, units + margin) end
  local slots = cap - redis.call('ZCARD', active)
  local steps = 0
  while served < nxt and steps < max_steps do
    local p = served + 1
    local rec = redis.call('HGET', places, p)
    if rec then
      local bar = string.find(rec, '|', 1, true)
      local id = string.sub(rec, bar + 1)
      if tonumber(redis.call('HGET', ids, id) or '0') == p then
        local s = tonumber(redis.call('HGET', seen, id) or '0')
        if s >= now - place_ttl then
          if tokens < 1 or slots < 1 then break end
          redis.call('ZADD', active, now + session, id)
          redis.call('HSET', admitted, id, string.sub(rec, 1, bar - 1) .. '|' .. p)
          tokens, slots, n_admitted = tokens - 1, slots - 1, n_admitted + 1
        else
          n_skipped = n_skipped + 1
        end
        redis.call('HDEL', seen, id)
      end
      redis.call('HDEL', places, p)
    end
    served, steps = p, steps + 1
  end
  redis.call('HSET', meta, 'served', served, 'tokens', tostring(tokens), 'last', now)
end
for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, keep) end
return {served, nxt, redis.call('ZCARD', active), n_admitted, n_skipped, expired, now, opened and 1 or 0, redis.call('ZCARD', pre), bought}
