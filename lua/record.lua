-- record.lua: the encodings of an order's record and of a user's entry, one
-- implementation for every script that reads or writes them (lua.go prepends
-- this file to those scripts; it is not a script itself). Both are short on
-- purpose: a live sale holds one of each per order and per user, and Redis
-- pays per byte (see docs/lifecycle.md, "Memory").
--
-- Order record (in its order bucket, order id -> record), by state:
--   open (P pending, C claimed)  "<S><qty>|<user>|<deadline_ms>|<mark>"
--                                 mark: "" | "q" queued (the broker confirmed its
--                                 message) | "a" adopted (a keyed replay publishes it)
--   K confirmed                  "K<qty>|<user>"
--   F failed                     "F<qty>|<user>|<reason>"; the tombstone an undo
--                                 leaves for an order id with no record is "F0|<user>|<reason>"
-- A settled record keeps no deadline: nothing reads it once MySQL decided.
--
-- User entry (in its user bucket, user id -> entry): "<held>" (units held: pending +
-- confirmed), then one "\n<key>\t<order id>" per idempotency key the user
-- reserved with (keys are printable ASCII, so neither "\n" nor "\t" occurs in
-- one). The key index lives with the user's count: one hash entry per user
-- instead of one more per keyed order. An entry holding nothing is deleted.
--
-- Buckets. Records and user entries are spread over small hashes that stay
-- listpack-encoded (a big hashtable hash costs ~45 B per entry more): the
-- record of order id o lives in "<base>o:<id_hash(o) mod n>", the entry of
-- user u in "<base>u:<id_hash(u) mod n>", where <base> is the sale's key
-- prefix ending in "{act:ID}:" (the meta key without "meta", so every bucket
-- shares the sale's hash tag and slot) and n is meta's "buckets" field, a
-- power of two chosen from the stock when warm.lua (or restore.lua, before
-- it) creates the sale and kept for the sale's life. reservation.Bucket is
-- the same computation in Go. A meta without "buckets" (a sale warmed before
-- buckets, or one that is not in Redis) means one hash each, the older names
-- "<base>orders" and "<base>users"; warm.lua moves what those hold into the
-- buckets when it creates the sale.

-- Orders (and users) per bucket the count aims at: under half of Redis's
-- default hash-max-listpack-entries (128), so that the hash spread and the
-- failed records beyond the stock still fit.
local bucket_fill = 64

-- bucket_max bounds the count, because every bucket is a key whose own cost
-- (~80 B each kind) is paid whether or not the sale sells: a sale that sells
-- a small part of a large stock (a 5,000,000-unit bench sale that sold
-- 13,400) paid 16,384 x 2 keys, 373 B per order, more than one big hash
-- each. 1,024 keep that fixed cost near 160 KB per sale and the scripts that
-- walk every bucket (a warm that builds a sale, sync, archive; ~0.5 us per
-- bucket) under a millisecond. A sale of more than 1,024 * 64 units that
-- sells most of it gets fuller buckets, which Redis turns into hashtables:
-- about what one big hash costs, never more.
local bucket_max = 1024

-- buckets_for returns the bucket count of a sale of total units: the
-- smallest power of two n with n * bucket_fill >= total, at most bucket_max.
local function buckets_for(total)
  local n = 1
  while n * bucket_fill < total and n < bucket_max do
    n = n * 2
  end
  return n
end

-- id_hash is the first 32 bits of SHA-1 of s, as a number. SHA-1 for its
-- speed here, not its strength: redis.sha1hex is C, about 0.4 us for an
-- order id where a byte loop in Lua (FNV-1a) took 2.4 us, twice per reserve.
local sha1hex = redis.sha1hex
local function id_hash(s)
  return tonumber(string.sub(sha1hex(s), 1, 8), 16)
end

-- sale_buckets returns the sale's bucket count, nil for the unbucketed layout.
local function sale_buckets(meta)
  return tonumber(redis.call('HGET', meta, 'buckets'))
end

local function sale_base(meta)
  return string.sub(meta, 1, -5)
end

-- order_key and user_key name the hash holding order oid's record and user
-- uid's entry, for a sale of n buckets (nil: unbucketed).
local function order_key(meta, n, oid)
  if not n then
    return sale_base(meta) .. 'orders'
  end
  return sale_base(meta) .. 'o:' .. (id_hash(oid) % n)
end

local function user_key(meta, n, uid)
  if not n then
    return sale_base(meta) .. 'users'
  end
  return sale_base(meta) .. 'u:' .. (id_hash(uid) % n)
end

-- rec_parse returns state, qty, user, deadline (number or nil), and the mark
-- (open) or reason (F); nil when rec is not a record.
local function rec_parse(rec)
  local state, qty, user, rest = string.match(rec, '^(%a)(%d+)|([^|]*)(.*)$')
  if not state then
    return nil
  end
  qty = tonumber(qty)
  if state == 'P' or state == 'C' then
    local d, mark = string.match(rest, '^|(%d*)|(.*)$')
    return state, qty, user, tonumber(d), mark or ''
  end
  return state, qty, user, nil, string.sub(rest, 2)
end

local function rec_open(state, qty, user, deadline, mark)
  return state .. qty .. '|' .. user .. '|' .. deadline .. '|' .. mark
end

local function rec_done(state, qty, user, reason)
  if state == 'K' then
    return 'K' .. qty .. '|' .. user
  end
  return 'F' .. qty .. '|' .. user .. '|' .. (reason or '')
end

-- user_split returns the units an entry holds and its key index ("" or
-- "\n<key>\t<oid>...").
local function user_split(entry)
  if not entry then
    return 0, ''
  end
  local nl = string.find(entry, '\n', 1, true)
  if not nl then
    return tonumber(entry) or 0, ''
  end
  return tonumber(string.sub(entry, 1, nl - 1)) or 0, string.sub(entry, nl)
end

local function user_get(users, user)
  return user_split(redis.call('HGET', users, user))
end

local function user_put(users, user, held, index)
  if held <= 0 and index == '' then
    redis.call('HDEL', users, user)
  else
    redis.call('HSET', users, user, math.max(held, 0) .. index)
  end
end

-- key_find returns the order id the index holds for key, or nil.
local function key_find(index, key)
  local needle = '\n' .. key .. '\t'
  local i = string.find(index, needle, 1, true)
  if not i then
    return nil
  end
  local from = i + #needle
  local j = string.find(index, '\n', from, true)
  return string.sub(index, from, (j or 0) - 1)
end

-- key_drop removes key from the index if it names oid.
local function key_drop(index, key, oid)
  local entry = '\n' .. key .. '\t' .. oid
  local i = string.find(index, entry, 1, true)
  if not i then
    return index
  end
  local after = i + #entry
  if after <= #index and string.sub(index, after, after) ~= '\n' then
    return index -- a longer order id: not this one
  end
  return string.sub(index, 1, i - 1) .. string.sub(index, after)
end

-- sale_hashes lists every hash of kind ('o' records, 'u' user entries) a
-- sale of n buckets may hold: the unbucketed one first, then the buckets.
local function sale_hashes(meta, n, kind)
  local base = sale_base(meta)
  local out = {base .. (kind == 'o' and 'orders' or 'users')}
  for b = 0, (n or 0) - 1 do
    out[#out + 1] = base .. kind .. ':' .. b
  end
  return out
end

-- orders_unbucketed moves the records of the unbucketed hash (written while
-- the sale was not in Redis, or by a version before buckets) into the n
-- buckets; a record a bucket holds already wins.
local function orders_unbucketed(meta, n)
  local from = sale_base(meta) .. 'orders'
  local old = redis.call('HGETALL', from)
  for i = 1, #old, 2 do
    redis.call('HSETNX', order_key(meta, n, old[i]), old[i], old[i + 1])
  end
  redis.call('DEL', from)
end

-- users_rebuild replaces every user's count with held (user -> units) and
-- keeps every key index: the counts come from MySQL and the open records,
-- the keys only Redis knows. The entries end up in the n buckets (an
-- unbucketed hash is emptied into them).
local function users_rebuild(meta, n, held)
  local kept = {}
  for _, users in ipairs(sale_hashes(meta, n, 'u')) do
    local old = redis.call('HGETALL', users)
    for i = 1, #old, 2 do
      local _, index = user_split(old[i + 1])
      if index ~= '' then
        kept[old[i]] = (kept[old[i]] or '') .. index
      end
    end
    if #old > 0 then
      redis.call('DEL', users)
    end
  end
  for user, index in pairs(kept) do
    user_put(user_key(meta, n, user), user, held[user] or 0, index)
  end
  for user, k in pairs(held) do
    if not kept[user] then
      user_put(user_key(meta, n, user), user, k, '')
    end
  end
end

-- open_recount counts the units of the open records the deadlines index
-- names into held (user -> units) and returns their sum, dropping index
-- entries of orders no longer open and the number of those.
local function open_recount(meta, n, deadlines, held)
  local pending, stale = 0, 0
  for _, oid in ipairs(redis.call('ZRANGE', deadlines, 0, -1)) do
    local rec = redis.call('HGET', order_key(meta, n, oid), oid)
    local state, qty, user
    if rec then
      state, qty, user = rec_parse(rec)
    end
    if state == 'P' or state == 'C' then
      pending = pending + qty
      held[user] = (held[user] or 0) + qty
    else
      redis.call('ZREM', deadlines, oid)
      stale = stale + 1
    end
  end
  return pending, stale
end

