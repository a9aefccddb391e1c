-- ratelimit.lua: exact sliding-window logs of the proxy's limiter. One call
-- decides a batch of requests (ops), in order, each against all of its
-- windows atomically, timed by Redis TIME (the one clock).
--
-- Each window is a sorted set with one member per admitted hit, scored with
-- the moment it was admitted (µs of Redis TIME); a member counts while
-- score > now - window. An op is admitted only if every one of its windows
-- has room for its weight; then each gets `weight` members
-- "<instance>:<seq>:<op>:<j>", else nothing is written. Because the whole
-- decision happens at one moment inside the script, every interval of a
-- window's length holds at most `limit` members: nothing is leased, held or
-- given back (except by a cluster caller whose op spans hash tags: it ZREMs
-- the members of an op a later tag refused).
--
-- On a single node the ops of a batch may name any keys; on a cluster all
-- KEYS of one call share a hash tag (the caller groups them).
--
-- KEYS[1..k]   window logs (each named once)
-- ARGV[1]      instance id, ARGV[2] call sequence number of that instance
-- then per op: weight (>= 1), n (>= 1), then n x (key index, limit >= 1,
--              window_ms >= 1)
--
-- Returns {now_us, then per op: admitted (1/0), then per window:
--          full, remaining, reset_ms}
--   full       1: fewer than `weight` free slots: this window refused the op
--   remaining  free slots after the op
--   reset_ms   full: ms until `weight` slots will have freed (the earliest
--              retry that can pass this window; window_ms when weight >
--              limit: never); else ms until the oldest member slides out (0
--              for an empty log). Rounded up.
-- Errors (before any write): malformed ARGV.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prefix = ARGV[1] .. ':' .. ARGV[2] .. ':'

local function int(v, lo)
  local x = tonumber(v)
  if not x or x < lo or x ~= math.floor(x) then return nil end
  return x
end

-- Parse and check everything first, so that a malformed call writes nothing.
local ops, a = {}, 3
while a <= #ARGV do
  local op = {weight = int(ARGV[a], 1), n = int(ARGV[a + 1], 1), w = {}}
  if not (op.weight and op.n) or a + 1 + 3 * op.n > #ARGV then
    return redis.error_reply('ERR ratelimit: bad weight/count of op ' .. (#ops + 1))
  end
  for i = 1, op.n do
    local b = a + 2 + 3 * (i - 1)
    local x = {k = int(ARGV[b], 1), limit = int(ARGV[b + 1], 1), win = int(ARGV[b + 2], 1)}
    if not (x.k and x.limit and x.win) or x.k > #KEYS then
      return redis.error_reply('ERR ratelimit: bad key/limit/window ' .. i .. ' of op ' .. (#ops + 1))
    end
    x.win = x.win * 1000
    op.w[i] = x
  end
  ops[#ops + 1] = op
  a = a + 2 + 3 * op.n
end
if #ops == 0 then
  return redis.error_reply('ERR ratelimit: no op')
end

-- Per key, once per call: drop what slid out, then keep the count here.
-- Members written by this call are the newest, so the ranks read below
-- (oldest first, below the count before the call) never move.
local count, oldest = {}, {}
local function open(x)
  if count[x.k] == nil then
    redis.call('ZREMRANGEBYSCORE', KEYS[x.k], '-inf', now - x.win)
    count[x.k] = redis.call('ZCARD', KEYS[x.k])
  end
end
local function scoreAt(k, rank)
  local c = oldest[k]
  if c == nil then c = {}; oldest[k] = c end
  if c[rank] == nil then
    c[rank] = tonumber(redis.call('ZRANGE', KEYS[k], rank, rank, 'WITHSCORES')[2])
  end
  return c[rank]
end
local function ms(us)
  if us < 0 then return 0 end
  return math.ceil(us / 1000)
end

local out, expire = {now}, {}
for o, op in ipairs(ops) do
  local ok = true
  for _, x in ipairs(op.w) do
    open(x)
    if x.limit - count[x.k] < op.weight then ok = false end
  end
  out[#out + 1] = ok and 1 or 0
  for _, x in ipairs(op.w) do
    local c = count[x.k]
    if ok then
      local args, p = {}, prefix .. o .. ':'
      for j = 1, op.weight do
        args[#args + 1] = now
        args[#args + 1] = p .. j
      end
      redis.call('ZADD', KEYS[x.k], unpack(args))
      c = c + op.weight
      count[x.k] = c
      if not expire[x.k] or expire[x.k] < x.win then expire[x.k] = x.win end
    end
    local free = x.limit - c
    if not ok and free < op.weight then
      out[#out + 1] = 1
      out[#out + 1] = math.max(0, free)
      if op.weight > x.limit then
        out[#out + 1] = x.win / 1000
      else
        -- the op fits once c - limit + weight members slid out
        out[#out + 1] = ms(scoreAt(x.k, c - x.limit + op.weight - 1) + x.win - now)
      end
    else
      out[#out + 1] = 0
      out[#out + 1] = math.max(0, free)
      if c == 0 then out[#out + 1] = 0 else out[#out + 1] = ms(scoreAt(x.k, 0) + x.win - now) end
    end
  end
end
-- A log lives while its newest member counts.
for k, win in pairs(expire) do
  redis.call('PEXPIRE', KEYS[k], win / 1000 + 1000)
end
return out
