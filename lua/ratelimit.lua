-- ratelimit.lua: exact sliding-window logs of the proxy's limiter. One call
-- checks and takes slots of every window of ONE hash tag that a request needs,
-- atomically, timed by Redis TIME (the one clock).
--
-- Each window is a sorted set with one member per admitted request or leased
-- slot: member = "<instance>:<seq>:<i>:<j>" (instance id, call sequence of that
-- instance, window index in the call, slot index 1..granted), score = the
-- latest time the slot may be spent, in microseconds of Redis TIME:
--   slot 1          the caller's own request, decided now:          now
--                   (now + short when the caller needs other calls too:
--                   it is admitted once they answer)
--   slots 2..need   requests waiting on this call (shared refill):  now + short
--   further slots   a speculative lease:                            now + lease
-- A member counts while score > now - window. Scoring a slot at the end of
-- its spending time is what keeps the window exact: a slot spent at any time
-- up to its score is inside the log for a whole window after it was spent.
-- The caller gives back slots it did not spend (ZREM of their members), in
-- its next call for the key; that call removes them before it counts.
--
-- All KEYS must share one hash tag (the caller groups windows by tag).
--
-- KEYS[1..n]      window logs
-- ARGV[1]         instance id (prefix of members)
-- ARGV[2]         call sequence number of that instance
-- ARGV[3]         live proxy instances (>= 1): caps a speculative lease
-- ARGV[4]         1: slot 1 is scored at now + short (the request waits for
--                 other calls before it is admitted); 0: at now
-- per window i, 7 values from ARGV[5 + 7(i-1)]:
--   limit         integer >= 1
--   window_ms     integer >= 1
--   need          integer >= 0: requests to admit now (0: give back only)
--   extra         integer >= 0: speculative slots wanted beyond need
--   short_ms      integer >= 0: spending time of slots 2..need
--   lease_ms      integer >= 0: spending time of the speculative slots
--   giveback      "" or space-separated "seq:i:from:to" member ranges of this
--                 instance to remove first
--
-- Returns {allowed, now_us, admitted, then per window: granted, full,
--          remaining, reset_ms, back_ms}
--   allowed    1: every window with need >= 1 had a free slot; each such
--              window granted a = min over them of min(need, free) slots
--              (the requests admitted now) plus a lease, written
--              0: at least one of them was full; nothing was written
--              (give-backs excepted)
--   now_us     Redis TIME of the decision, microseconds
--   admitted   a above (0 when not allowed): slots 1..a of every window are
--              the caller's and its waiters', the rest a lease
--   granted    slots written for window i (0 when not allowed)
--   full       1: window i had no free slot (it refused this request)
--   remaining  free slots of window i after this call
--   reset_ms   ms until the next slot of window i frees, rounded up; 0 for
--              an empty log. With remaining = 0 this is the earliest moment
--              a retry can be admitted.
--   back_ms    with remaining = 0: ms (rounded down) until the earliest
--              member of another instance scored after now (among the
--              first 64 such members), a leased slot that instance may give
--              back once its time is up (so a "full" answer is not trusted
--              past it); -1 when there is none or remaining > 0
-- Errors (before any write): malformed ARGV.
local n = #KEYS
if n < 1 or #ARGV ~= 4 + 7 * n then
  return redis.error_reply('ERR ratelimit: want 4+7*' .. n .. ' ARGV, got ' .. #ARGV)
end
local live = tonumber(ARGV[3])
if not live or live < 1 or live ~= math.floor(live) then
  return redis.error_reply('ERR ratelimit: bad live ' .. tostring(ARGV[3]))
end
local first = ARGV[4]
if first ~= '0' and first ~= '1' then
  return redis.error_reply('ERR ratelimit: bad first ' .. tostring(first))
end
local function int(v, lo)
  local x = tonumber(v)
  if not x or x < lo or x ~= math.floor(x) then return nil end
  return x
end
local w = {}
local any = false
for i = 1, n do
  local b = 4 + 7 * (i - 1)
  local x = {limit = int(ARGV[b + 1], 1), win = int(ARGV[b + 2], 1), need = int(ARGV[b + 3], 0),
    extra = int(ARGV[b + 4], 0), short = int(ARGV[b + 5], 0), lease = int(ARGV[b + 6], 0), back = {}}
  if not (x.limit and x.win and x.need and x.extra and x.short and x.lease) then
    return redis.error_reply('ERR ratelimit: bad limit/window/need/extra/short/lease for window ' .. i)
  end
  for seq, wi, from, to in string.gmatch(ARGV[b + 7], '(%d+):(%d+):(%d+):(%d+)') do
    from, to = tonumber(from), tonumber(to)
    if from < 1 or to < from or to - from > 100000 then
      return redis.error_reply('ERR ratelimit: bad giveback range for window ' .. i)
    end
    x.back[#x.back + 1] = {seq, wi, from, to}
  end
  if x.need > 0 then any = true end
  x.win, x.short, x.lease = x.win * 1000, x.short * 1000, x.lease * 1000
  w[i] = x
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prefix = ARGV[1] .. ':'

-- Give back unspent slots, then drop what slid out, then count.
local allowed = any
for i = 1, n do
  local key, x = KEYS[i], w[i]
  for _, r in ipairs(x.back) do
    local p = prefix .. r[1] .. ':' .. r[2] .. ':'
    local j = r[3]
    while j <= r[4] do
      local args = {}
      local last = math.min(r[4], j + 499)
      for s = j, last do args[#args + 1] = p .. s end
      redis.call('ZREM', key, unpack(args))
      j = last + 1
    end
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - x.win)
  x.count = redis.call('ZCARD', key)
  x.free = x.limit - x.count
  if x.need > 0 and x.free < 1 then allowed = false end
end

-- reset: time until count - limit + 1 slots have slid out (the one at rank
-- count - limit, oldest first, is the last of them), or until the oldest
-- slides out while there is room.
local function reset(key, x, count)
  if count == 0 then return 0 end
  local rank = 0
  if count >= x.limit then rank = count - x.limit end
  local o = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  local r = tonumber(o[2]) + x.win - now
  if r < 0 then r = 0 end
  return math.ceil(r / 1000)
end

-- Requests admitted now: at most what every window of the call can take
-- (more slots in one window would only wait unspent while another refuses).
local admit = math.huge
for i = 1, n do
  local x = w[i]
  if x.need > 0 then admit = math.min(admit, x.need, x.free) end
end

local out = {allowed and 1 or 0, now, allowed and admit or 0}
local seq = ARGV[2]
for i = 1, n do
  local key, x = KEYS[i], w[i]
  local g, full = 0, 0
  if x.need > 0 and x.free < 1 then full = 1 end
  if allowed and x.need > 0 then
    local gn = admit
    local ge = math.floor((x.free - gn) / (2 * live))
    if ge > x.extra then ge = x.extra end
    g = gn + ge
    local p = prefix .. seq .. ':' .. i .. ':'
    local j = 1
    while j <= g do
      local args = {}
      local last = math.min(g, j + 499)
      for s = j, last do
        local score = now + x.lease
        if s <= gn then score = now + x.short end
        if s == 1 and first == '0' then score = now end
        args[#args + 1] = score
        args[#args + 1] = p .. s
      end
      redis.call('ZADD', key, unpack(args))
      j = last + 1
    end
    -- The key lives while its latest member can count; never shorten it
    -- (a reload may have shortened the lease).
    local ttl = math.ceil((x.win + math.max(x.short, x.lease)) / 1000) + 1
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  end
  local count = x.count + g
  out[#out + 1] = g
  out[#out + 1] = full
  out[#out + 1] = math.max(0, x.limit - count)
  out[#out + 1] = reset(key, x, count)
  local back = -1
  if x.limit - count <= 0 then
    -- Another instance's member: the caller knows its own leases (and
    -- forgets its negative answer when it gives them back). A bounded look.
    local o = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 64)
    for k = 1, #o, 2 do
      if string.sub(o[k], 1, #prefix) ~= prefix then
        back = math.floor((tonumber(o[k + 1]) - now) / 1000)
        break
      end
    end
  end
  out[#out + 1] = back
end
return out
