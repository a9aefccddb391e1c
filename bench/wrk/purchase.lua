-- purchase.lua — wrk script for the seckill purchase path.
--
--   wrk -t2 -c64 -d10s -s bench/wrk/purchase.lua http://127.0.0.1:8080 -- 42 20000
--
-- Arguments after "--": activity id (default 1), number of distinct users
-- (default 20000), quantity (default 1). Every request is a new purchase: a
-- random X-User-ID out of the pool and a fresh Idempotency-Key (thread id +
-- counter, so keys never repeat across threads). The sale must exist
-- (create it with the admin API or let bin/bench do it). wrk measures the
-- raw request rate and latency of whatever answers (202, 409, 429); it does
-- not verify orders — bin/bench does.

local activity, users, quantity = 1, 20000, 1
local counter = 0
local threads = {}

-- setup runs in wrk's main thread; thread:set makes "tid" a global of the
-- thread's own Lua state.
function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function init(args)
  activity = tonumber(args[1]) or activity
  users = tonumber(args[2]) or users
  quantity = tonumber(args[3]) or quantity
  tid = tonumber(tid) or 0
  math.randomseed(os.time() * 1000 + tid)
  wrk.method = "POST"
  wrk.path = "/api/v1/activities/" .. activity .. "/purchase"
  wrk.body = '{"quantity":' .. quantity .. '}'
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  counter = counter + 1
  local user = "u" .. math.random(0, users - 1)
  local key = string.format("wrk-%d-%d-%d", os.time(), tid, counter)
  wrk.headers["X-User-ID"] = user
  wrk.headers["Idempotency-Key"] = key
  return wrk.format(nil, nil, nil, nil)
end

local statuses = {}
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  io.write(string.format("requests %d, errors: connect %d read %d write %d status %d timeout %d\n",
    summary.requests, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout))
  for _, p in ipairs({50, 90, 99, 99.9}) do
    io.write(string.format("p%-5s %8.2f ms\n", p, latency:percentile(p) / 1000))
  end
end
