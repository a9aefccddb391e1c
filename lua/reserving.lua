-- reserving.lua: reserve_one, the checks and the reservation of one purchase
-- attempt, one implementation for reserve.lua (one request) and
-- reserve_multi.lua (a group of requests of one sale shard, the backend's
-- group commit). lua.go puts it (after record.lua) before both; it is not a
-- script itself. Every check runs per request, in this order, reading the
-- sale as the requests before it in the same call left it: the sale in Redis,
-- the stock shard count, the bucket count, the idempotent repeat of its own order id, the
-- idempotency key, the quantity, the sale window (Redis TIME), recovery, the
-- per-user limit, the stock. Nothing is written before every check of the request has passed.
--
-- reserve_one(sc, meta_key, deadlines_key, recovering_key, orders, users,
--             a_user, a_key, a_qty, a_oid, a_ttl, a_buckets, a_shards)
--   sc: what one script call reads once for all its requests (a table, {}
--     to begin with): the sale's meta, Redis TIME and the recovering mark.
--     Nothing else changes them during the call but this function's own
--     pending increments, which it keeps in sc.meta too, so a request still
--     sees the sale as the ones before it left it.
--   meta_key, deadlines_key, recovering_key: the sale's meta, deadlines and
--     recovering keys (reserve.lua's KEYS[1..3]); orders, users: the buckets of
--     the order's record and of the user's entry (KEYS[4], KEYS[5]); a_user ..
--     a_shards: reserve.lua's ARGV[1..7] (a_shards nil: 1). Returns reserve.lua's reply.

local function reserve_one(sc, meta_key, deadlines_key, recovering_key, orders, users,
                           a_user, a_key, a_qty, a_oid, a_ttl, a_buckets, a_shards)
  local meta = sc.meta
  if not meta then
    meta = redis.call('HMGET', meta_key, 'total', 'sold', 'pending', 'limit', 'start', 'end', 'buckets', 'shards')
    sc.meta = meta
  end
  if not meta[1] then
    return {'not_found'}
  end
  if (tonumber(meta[8]) or 1) ~= (tonumber(a_shards) or 1) then
    return {'shards', tonumber(meta[8]) or 1}
  end
  local user, key, oid = a_user, a_key, a_oid
  local nb = tonumber(meta[7])
  if (nb or 0) ~= tonumber(a_buckets) then
    return {'buckets', nb or 0}
  end
  local mine = redis.call('HGET', orders, oid)
  if mine then
    local state, _, owner, deadline, reason = rec_parse(mine)
    if owner ~= user then
      return {'conflict'}
    end
    if state == 'F' then
      return {'undone', reason}
    end
    return {'ok', oid, deadline or 0}
  end
  local held, index = user_get(users, user)
  if key ~= '' then
    local prior = key_find(index, key)
    if prior then
      local prior_orders = order_key(meta_key, nb, prior)
      local rec = redis.call('HGET', prior_orders, prior)
      if rec then
        local state, qty, _, deadline, mark = rec_parse(rec)
        local queued = 0
        if mark == 'q' and (state == 'P' or state == 'C') then
          queued = 1
        elseif state == 'P' and mark == '' then
          -- Adopted: this replay publishes the order itself, so the undo of
          -- the attempt that reserved it may no longer release it.
          redis.call('HSET', prior_orders, prior, rec_open(state, qty, user, deadline, 'a'))
        end
        return {'replay', prior, state, qty, deadline or 0, queued}
      end
      return {'replay', prior, '?', 0, 0, 0}
    end
  end
  local qty = tonumber(a_qty)
  local total, sold, pending = tonumber(meta[1]), tonumber(meta[2]), tonumber(meta[3])
  local limit, start_ms, end_ms = tonumber(meta[4]), tonumber(meta[5]), tonumber(meta[6])
  if not qty or qty < 1 or qty > limit or qty ~= math.floor(qty) then
    return {'bad_quantity', limit}
  end
  if not sc.now then
    local t = redis.call('TIME')
    sc.now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local now = sc.now
  if now < start_ms then
    return {'not_started', start_ms}
  end
  if now >= end_ms then
    return {'ended', end_ms}
  end
  if sc.recovering == nil then
    sc.recovering = redis.call('GET', recovering_key) -- false: not recovering
  end
  if sc.recovering then
    return {'unsure', sc.recovering}
  end
  if held + qty > limit then
    return {'limit_exceeded', held, limit}
  end
  local available = total - sold - pending
  if available <= 0 then
    return {'sold_out'}
  end
  if available < qty then
    return {'insufficient', available}
  end
  local deadline = now + tonumber(a_ttl)
  redis.call('HINCRBY', meta_key, 'pending', qty)
  meta[3] = pending + qty
  if key ~= '' then
    index = index .. '\n' .. key .. '\t' .. oid
  end
  user_put(users, user, held + qty, index)
  redis.call('HSET', orders, oid, rec_open('P', qty, user, deadline, ''))
  redis.call('ZADD', deadlines_key, deadline, oid)
  return {'ok', oid, deadline}
end
