-- record.lua: the encodings of an order's record and of a user's entry, one
-- implementation for every script that reads or writes them (lua.go prepends
-- this file to those scripts; it is not a script itself). Both are short on
-- purpose: a live sale holds one of each per order and per user, and Redis
-- pays per byte (see docs/lifecycle.md, "Memory").
--
-- Order record (orders hash, order id -> record), by state:
--   open (P pending, C claimed)  "<S><qty>|<user>|<deadline_ms>|<mark>"
--                                 mark: "" | "q" queued (the broker confirmed its
--                                 message) | "a" adopted (a keyed replay publishes it)
--   K confirmed                  "K<qty>|<user>"
--   F failed                     "F<qty>|<user>|<reason>"; the tombstone an undo
--                                 leaves for an order id with no record is "F0|<user>|<reason>"
-- A settled record keeps no deadline: nothing reads it once MySQL decided.
--
-- User entry (users hash, user id -> entry): "<held>" (units held: pending +
-- confirmed), then one "\n<key>\t<order id>" per idempotency key the user
-- reserved with (keys are printable ASCII, so neither "\n" nor "\t" occurs in
-- one). The key index lives with the user's count: one hash entry per user
-- instead of one more per keyed order. An entry holding nothing is deleted.

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

-- users_rebuild replaces every user's count with held (user -> units) and
-- keeps every key index: the counts come from MySQL and the open records,
-- the keys only Redis knows.
local function users_rebuild(users, held)
  local kept = {}
  local old = redis.call('HGETALL', users)
  for i = 1, #old, 2 do
    local _, index = user_split(old[i + 1])
    if index ~= '' then
      kept[old[i]] = index
    end
  end
  redis.call('DEL', users)
  for user, index in pairs(kept) do
    user_put(users, user, held[user] or 0, index)
  end
  for user, n in pairs(held) do
    if not kept[user] then
      user_put(users, user, n, '')
    end
  end
end

