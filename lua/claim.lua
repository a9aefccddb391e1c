-- claim.lua: a worker takes orders over before writing them to MySQL, so that
-- the backend's release can no longer move them (see release.lua).
--
-- KEYS[1] meta (see reserve.lua; the records are in the sale's buckets, record.lua)
-- ARGV    order ids
--
-- Returns one state letter per order id, in order:
--   "C" claimed now or before: write it to MySQL
--   "K" confirmed already (a redelivery): MySQL has it
--   "F" released or failed already: record it as failed, never confirm it
--   "?" no record (Redis lost it): MySQL's guards decide alone

local out = {}
local nb = sale_buckets(KEYS[1])
for i, oid in ipairs(ARGV) do
  local orders = order_key(KEYS[1], nb, oid)
  local rec = redis.call('HGET', orders, oid)
  if not rec then
    out[i] = '?'
  else
    local state = string.sub(rec, 1, 1)
    if state == 'P' then
      redis.call('HSET', orders, oid, 'C' .. string.sub(rec, 2))
      state = 'C'
    end
    out[i] = state
  end
end
return out
