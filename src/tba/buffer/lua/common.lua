-- Prepended to every script. KEYS[1] is the key prefix; every key is "<prefix>:<name>".
-- Lua turns numbers into strings with 14 significant digits: ids, times and scores go
-- through int() instead, and floats through string.format('%.17g'), so nothing rounds.
local prefix = KEYS[1]

local function key(name)
  return prefix .. ':' .. name
end

local function int(n)
  return string.format('%d', n)
end

-- A trajectory's meta field, "version bin reward digest prompt_id" (RedisStore writes it):
-- its five parts, as strings.
local function parse_meta(meta)
  return string.match(meta, '^(%S+) (%S+) (%S+) (%S+) (.+)$')
end

-- Ends a lease: each of its prompts still under it loses that mark and, when `requeue_ms`
-- is given, becomes available then (the back of the rotation).
local function release_lease(lease_id, requeue_ms)
  local record = redis.call('HGET', key('leases'), lease_id)
  if not record then
    return
  end
  local expires_ms = nil
  for token in string.gmatch(record, '%S+') do
    if not expires_ms then
      expires_ms = tonumber(token)
    elseif redis.call('HGET', key('lease_of'), token) == lease_id then
      redis.call('HDEL', key('lease_of'), token)
      if requeue_ms and tonumber(requeue_ms) < expires_ms then
        redis.call('ZADD', key('pool'), requeue_ms, token)
      end
    end
  end
  redis.call('HDEL', key('leases'), lease_id)
  redis.call('ZREM', key('lease_exp'), lease_id)
end

