-- ratelimit.lua: exact sliding-window logs for every window one request needs,
-- checked and taken in ONE atomic call, timed by Redis TIME (the one clock).
--
-- Each window is a sorted set: one member per admitted request (or leased slot),
-- member = "<instance>:<seq>:<i>:<j>" (unique: instance id + call sequence +
-- window index + slot index, never a bare timestamp), score = admission time in
-- microseconds. Only admitted requests are added, so a client that keeps
-- hammering is not locked out beyond the window; a log never holds more than its
-- limit (a slot is only added while count < limit); the key's TTL is the window.
--
-- Cluster slots: the per-IP windows of several rules and the global windows of
-- one request must sit in ONE slot to be checked atomically, and a global window
-- is shared by every client. So every limiter key carries the same hash tag
-- "{rl}" (e.g. "<prefix>{rl}:w:purchase:ip:203.0.113.7"): the limiter lives on
-- one shard. That is deliberate: the local token cache keeps Redis calls to a
-- few per hundred requests, so one shard carries it; different stacks use
-- different key prefixes.
--
-- KEYS[1]        live-instance set (member = instance id, score = last call, µs)
-- KEYS[2..n+1]   window logs, one per window the request needs
-- ARGV[1]        instance id (heartbeat member, prefix of slot members)
-- ARGV[2]        call sequence number of that instance
-- ARGV[3]        liveness in ms: instances silent longer are not counted
-- ARGV[4+3(i-1)] limit of window i          (integer >= 1)
-- ARGV[5+3(i-1)] length of window i in ms   (integer >= 1)
-- ARGV[6+3(i-1)] slots wanted from window i (integer >= 1; > 1 asks for a lease)
--
-- Returns {live, allowed, g_1, r_1, t_1, ..., g_n, r_n, t_n}
--   live     number of live instances (this one included)
--   allowed  1: every window granted g_i >= 1 slots, all were written
--            0: some window is full; nothing was written, g_i = 0 for the
--               full windows (the violated ones)
--   g_i      slots granted: min(wanted, free, max(1, floor(free / (2 * live))))
--            so a lease is large far from the limit and 1 near it
--   r_i      slots still free after this call
--   t_i      ms until the next slot of window i frees (exact, rounded up): for
--            a full window the earliest time a retry can be admitted; 0 when
--            the log is empty
-- Errors (before any write): a malformed ARGV.
local n = #KEYS - 1
if #ARGV ~= 3 + 3 * n then
  return redis.error_reply('ERR ratelimit: want ' .. (3 + 3 * n) .. ' ARGV, got ' .. #ARGV)
end
local liveness = tonumber(ARGV[3])
if not liveness or liveness < 1 then
  return redis.error_reply('ERR ratelimit: bad liveness ' .. tostring(ARGV[3]))
end
local limits, wins, wants = {}, {}, {}
for i = 1, n do
  local b = 3 + 3 * (i - 1)
  local l, w, k = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  if not l or l < 1 or l ~= math.floor(l) or not w or w < 1 or w ~= math.floor(w)
      or not k or k < 1 or k ~= math.floor(k) then
    return redis.error_reply('ERR ratelimit: bad limit/window/want for window ' .. i)
  end
  limits[i], wins[i], wants[i] = l, w * 1000, k
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Heartbeat: every call (and an idle instance's periodic call with n = 0).
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - liveness * 1000)
redis.call('PEXPIRE', KEYS[1], liveness * 2)
local live = redis.call('ZCARD', KEYS[1])

local out = {live, 1}
local grants = {}
local allowed = true
for i = 1, n do
  local key, limit, win = KEYS[i + 1], limits[i], wins[i]
  -- A slot admitted at s is inside the window while s > now - win.
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - win)
  local count = redis.call('ZCARD', key)
  local free = limit - count
  local g, reset = 0, 0
  if free >= 1 then
    g = math.floor(free / (2 * live))
    if g < 1 then g = 1 end
    if g > wants[i] then g = wants[i] end
    if g > free then g = free end
    if count > 0 then
      local o = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      reset = tonumber(o[2]) + win - now
    end
  else
    allowed = false
    -- count - limit + 1 slots must expire before one is free: the one at
    -- rank count - limit (0-based, oldest first) is the last of them.
    local o = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
    reset = tonumber(o[2]) + win - now
  end
  if reset < 0 then reset = 0 end
  grants[i] = g
  out[#out + 1] = g
  out[#out + 1] = free - g
  out[#out + 1] = math.ceil(reset / 1000)
end

if not allowed then
  out[2] = 0
  for i = 1, n do
    if grants[i] > 0 then
      out[3 + 3 * (i - 1) + 1] = out[3 + 3 * (i - 1) + 1] + grants[i]
      out[3 + 3 * (i - 1)] = 0
    end
  end
  return out
end

local prefix = ARGV[1] .. ':' .. ARGV[2] .. ':'
for i = 1, n do
  local key, g = KEYS[i + 1], grants[i]
  local j = 1
  while j <= g do
    local args = {}
    local last = math.min(g, j + 499)
    for s = j, last do
      args[#args + 1] = now
      args[#args + 1] = prefix .. i .. ':' .. s
    end
    redis.call('ZADD', key, unpack(args))
    j = last + 1
  end
  redis.call('PEXPIRE', key, wins[i] / 1000)
end
return out
