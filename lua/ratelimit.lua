-- ratelimit.lua: exact sliding-window logs of the proxy's limiter. One call
-- decides a batch of ops in order, each against all of its windows at one
-- moment (Redis TIME). A window is a sorted set, one member per admitted hit
-- scored with the moment it was admitted (µs); it counts while score >
-- now - window. An op is admitted only if every window has room for its
-- weight; then each gets `weight` members "<instance>:<seq>:<op>:<j>", else
-- nothing is written. So every interval of a window's length holds at most
-- `limit` members (docs/limiter.md). On a cluster all KEYS share a hash tag.
--
-- Leases: an admitted op may also ask, per window, for up to `lease` more
-- slots that its instance then spends locally until now + spend. They are
-- members "<instance>:<seq>:<op>:l<j>" scored at that end of the spending
-- time, so each counts from no earlier than any hit spent from it (every
-- interval holding a spent hit and the decision that granted it holds the
-- member too). Granted only while the window is far from its limit: g slots
-- when at least 2 x live x g are free before the grant, so slots an
-- instance leaves unspent never cost much of a window near its limit; it
-- removes them when the spending time ends, so a window left without a free
-- slot while it holds leased slots resets no later than the first such end
-- (+1 ms).
--
-- KEYS   the window logs, each named once
-- ARGV   instance id, call sequence, live instances >= 1, spend_ms >= 1,
--        then per op: weight >= 0 (0: a lease alone), n >= 1, then
--        n x (key index, limit >= 1, window_ms >= 1, lease >= 0)
-- Returns {now_us, per op: admitted 1/0, per window: full, remaining,
--   reset_ms[, leased]}: full when fewer than `weight` slots were free (this
--   window refused); remaining after the op and its lease; reset_ms for a
--   full window until the weight fits (window_ms when weight > limit:
--   never), else until the oldest member slides out (0: empty); leased, only
--   where a lease was asked for: the slots granted. Malformed ARGV is
--   refused before any write.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prefix = ARGV[1] .. ':' .. ARGV[2] .. ':'

local tonumber, floor, argv, nargv, nkeys = tonumber, math.floor, ARGV, #ARGV, #KEYS
-- int: v as an integer >= least, or nil
local function int(v, least)
  local x = tonumber(v)
  if x and x >= least and x == floor(x) then return x end
end

local live, spend = int(argv[3], 1), int(argv[4], 1)
if not (live and spend) then return redis.error_reply('ERR ratelimit: bad live/spend') end
spend = spend * 1000
local ops, a = {}, 5
while a <= nargv do
  local weight, n = int(argv[a], 0), int(argv[a + 1], 1)
  if not (weight and n) or a + 1 + 4 * n > nargv then
    return redis.error_reply('ERR ratelimit: bad weight/count of op ' .. (#ops + 1))
  end
  local op = {weight = weight, w = {}}
  for i = 1, n do
    local b = a + 2 + 4 * (i - 1)
    local k, limit, win, lease = int(argv[b], 1), int(argv[b + 1], 1), int(argv[b + 2], 1), int(argv[b + 3], 0)
    if not (k and limit and win and lease) or k > nkeys then
      return redis.error_reply('ERR ratelimit: bad key/limit/window/lease ' .. i .. ' of op ' .. (#ops + 1))
    end
    op.w[i] = {k = k, limit = limit, win = win * 1000, lease = lease}
  end
  ops[#ops + 1] = op
  a = a + 2 + 4 * n
end
if #ops == 0 then return redis.error_reply('ERR ratelimit: no op') end

-- Once per key and call: count what still counts (ZCOUNT; what slid out is
-- dropped only where this call writes).
local count, fresh, pruned, dead, scores, expire, soonest = {}, {}, {}, {}, {}, {}, {}
-- leaseEnd: the earliest score after now (the first end of a spending time:
-- leased slots that may come back unspent then), else false; once per key
-- and call, then kept up to date by this call's own leases.
local function leaseEnd(k)
  if soonest[k] == nil then
    local v = tonumber(redis.call('ZRANGEBYSCORE', KEYS[k], string.format('(%.0f', now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2])
    soonest[k] = v ~= nil and v
  end
  return soonest[k]
end
-- liveScore: the score of the r-th (oldest first, 0-based) member that still
-- counts. Cached by that rank, which pruning does not move; a write at now
-- moves only the ranks of members scored after now (leases), so it drops
-- those (stale). The members that slid out but are not pruned yet are
-- counted once per key.
local function liveScore(x, r)
  local sk = scores[x.k]
  if sk == nil then
    sk = {}
    scores[x.k] = sk
  end
  if sk[r] == nil then
    local d = 0
    if not pruned[x.k] then
      if dead[x.k] == nil then dead[x.k] = redis.call('ZCOUNT', KEYS[x.k], '-inf', now - x.win) end
      d = dead[x.k]
    end
    sk[r] = tonumber(redis.call('ZRANGE', KEYS[x.k], d + r, d + r, 'WITHSCORES')[2])
  end
  return sk[r]
end
local function ms(us) return math.max(0, math.ceil(us / 1000)) end
-- leasable: only windows of at least 64 per 500 ms or longer are leased
-- (proxy/internal/limiter/lease.go asks for no others), so only those can
-- hold leased slots and need their lease end read.
local function leasable(x) return x.limit >= 64 and x.win >= 500000 end
local function moved(k)
  local sk = scores[k]
  if sk and next(sk) and leaseEnd(k) then
    for r, v in pairs(sk) do
      if v > now then sk[r] = nil end
    end
  end
end

local out = {now}
for o, op in ipairs(ops) do
  local ok = true
  for _, x in ipairs(op.w) do
    if count[x.k] == nil then
      -- string.format, not ..: Lua's own number-to-string keeps 14
      -- digits, and µs since 1970 have 16
      count[x.k] = redis.call('ZCOUNT', KEYS[x.k], string.format('(%.0f', now - x.win), '+inf')
      fresh[x.k] = count[x.k] == 0
    end
    if x.limit - count[x.k] < op.weight then ok = false end
  end
  out[#out + 1] = ok and 1 or 0
  for _, x in ipairs(op.w) do
    if ok then
      if not pruned[x.k] then
        redis.call('ZREMRANGEBYSCORE', KEYS[x.k], '-inf', now - x.win)
        pruned[x.k] = true
      end
      if op.weight > 0 then
        local args, p = {}, prefix .. o .. ':'
        for j = 1, op.weight do
          args[2 * j - 1], args[2 * j] = now, p .. j
        end
        redis.call('ZADD', KEYS[x.k], unpack(args))
        moved(x.k)
        count[x.k] = count[x.k] + op.weight
      end
      expire[x.k] = math.max(expire[x.k] or 0, x.win)
    end
    local leased = 0
    if ok and x.lease > 0 and leasable(x) then
      -- at most 512: a call writes them all at once while Redis waits
      leased = math.min(x.lease, 512, math.floor((x.limit - count[x.k]) / (2 * live)))
      if leased > 0 then
        local largs, p = {}, prefix .. o .. ':l'
        for j = 1, leased do
          largs[2 * j - 1], largs[2 * j] = now + spend, p .. j
        end
        redis.call('ZADD', KEYS[x.k], unpack(largs))
        moved(x.k)
        soonest[x.k] = leaseEnd(x.k) or now + spend
        count[x.k] = count[x.k] + leased
        expire[x.k] = math.max(expire[x.k], x.win + spend)
      end
    end
    local c = count[x.k]
    local full = not ok and x.limit - c < op.weight
    out[#out + 1] = full and 1 or 0
    out[#out + 1] = math.max(0, x.limit - c)
    local r
    if full and op.weight > x.limit then
      r = x.win / 1000
    elseif full then -- the op fits once c - limit + weight members slid out
      r = ms(liveScore(x, c - x.limit + op.weight - 1) + x.win - now)
    elseif c == 0 then
      r = 0
    elseif fresh[x.k] then -- its oldest counting member is this call's
      r = x.win / 1000
    else
      r = ms(liveScore(x, 0) + x.win - now)
    end
    -- A window that refused, or is left without a free slot, may get room
    -- sooner: when the first leased slots' spending time ends they come
    -- back if unspent.
    if (full or c >= x.limit) and not (full and op.weight > x.limit) and leasable(x) then
      local e = leaseEnd(x.k)
      if e then r = math.min(r, ms(e - now) + 1) end
    end
    out[#out + 1] = r
    if x.lease > 0 then out[#out + 1] = leased end
  end
end
-- A log lives while its newest member counts.
for k, win in pairs(expire) do
  redis.call('PEXPIRE', KEYS[k], win / 1000 + 1000)
end
return out
