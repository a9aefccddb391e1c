-- archive.lua: archive an ended sale — drop its per-order and per-user state
-- and keep a small summary (the meta hash, marked archived, with a TTL).
-- The caller (the worker's archiver) holds MySQL's row lock on the activity
-- (SELECT ... FOR UPDATE), which every admin change takes too, and passes
-- what it read under it; this script archives only when Redis agrees with
-- that read in the same atomic step, so a purchase or an admin change racing
-- the archiver is either before it (and it refuses) or after it.
--
-- KEYS[1] meta, KEYS[2] deadlines (see reserve.lua); the sale's buckets
-- (record.lua) are deleted, every one, and the unbucketed hashes with them
-- ARGV[1] generation (MySQL's activities.generation, read under the lock)
-- ARGV[2] total stock (MySQL), ARGV[3] units sold (MySQL)
-- ARGV[4] grace in ms after the sale's end, ARGV[5] TTL of the summary in ms
--
-- Returns the outcome, nothing changed unless "archived":
--   {"archived"}          done now
--   {"already", gen}      archived before, at generation gen
--   {"missing"}           no sale in Redis
--   {"stale", gen}        Redis holds another generation (an admin change
--                         that is not yet, or no longer, what MySQL holds)
--   {"open", due_ms}      the sale's end + grace is still ahead (Redis TIME)
--   {"pending", units, open_orders}  reservations are not settled yet
--   {"disagree", total, sold}        Redis's counters differ from MySQL's

local m = redis.call('HMGET', KEYS[1], 'total', 'sold', 'pending', 'end', 'gen', 'archived', 'buckets')
if not m[1] then
  return {'missing'}
end
if m[6] then
  return {'already', tonumber(m[5]) or 0}
end
if (tonumber(m[5]) or 0) ~= tonumber(ARGV[1]) then
  return {'stale', tonumber(m[5]) or 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = tonumber(m[4]) + tonumber(ARGV[4])
if now < due then
  return {'open', due}
end
local open = redis.call('ZCARD', KEYS[2])
if tonumber(m[3]) ~= 0 or open ~= 0 then
  return {'pending', tonumber(m[3]), open}
end
if tonumber(m[1]) ~= tonumber(ARGV[2]) or tonumber(m[2]) ~= tonumber(ARGV[3]) then
  return {'disagree', tonumber(m[1]), tonumber(m[2])}
end
local nb = tonumber(m[7])
for _, kind in ipairs({'o', 'u'}) do
  local keys = sale_hashes(KEYS[1], nb, kind)
  for i = 1, #keys, 1000 do
    redis.call('DEL', unpack(keys, i, math.min(i + 999, #keys)))
  end
end
redis.call('DEL', KEYS[2])
-- No bucket is left: a reopen chooses its count anew (restore.lua, warm.lua).
redis.call('HDEL', KEYS[1], 'buckets')
redis.call('HSET', KEYS[1], 'archived', now)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {'archived'}
