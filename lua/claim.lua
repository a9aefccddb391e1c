-- claim.lua: a worker takes orders over before writing them to MySQL, so that
-- the backend's release can no longer move them (see release.lua).
--
-- KEYS[1] orders (see reserve.lua)
-- ARGV    order ids
--
-- Returns one state letter per order id, in order:
--   "C" claimed now or before: write it to MySQL
--   "K" confirmed already (a redelivery): MySQL has it
--   "F" released or failed already: record it as failed, never confirm it
--   "?" no record (Redis lost it): MySQL's guards decide alone

local out = {}
for i, oid in ipairs(ARGV) do
  local rec = redis.call('HGET', KEYS[1], oid)
  if not rec then
    out[i] = '?'
  else
    local state = string.sub(rec, 1, 1)
    if state == 'P' then
      redis.call('HSET', KEYS[1], oid, 'C' .. string.sub(rec, 2))
      state = 'C'
    end
    out[i] = state
  end
end
return out
