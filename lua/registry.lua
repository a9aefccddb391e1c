-- registry.lua: shared by consumers.lua and pass.lua (put before them).

-- consumers_live drops the expired entries of registry hash reg (each one
-- counted in "~removed") and returns the set of live consumer ids.
local function consumers_live(reg, now)
  local live = {}
  local all = redis.call('HGETALL', reg)
  for i = 1, #all, 2 do
    local id = all[i]
    if string.sub(id, 1, 1) ~= '~' then
      if tonumber(all[i + 1]) < now then
        redis.call('HDEL', reg, id)
        redis.call('HINCRBY', reg, '~removed', 1)
      else
        live[id] = true
      end
    end
  end
  return live
end

-- consumers_round names the queue's current round: it changes whenever a
-- consumer leaves or the registry is created anew.
local function consumers_round(reg)
  local v = redis.call('HMGET', reg, '~since', '~removed')
  return (v[1] or '') .. '.' .. (v[2] or '0')
end
