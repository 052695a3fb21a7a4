-- ARGV: request_id, searcher_id, lease_id, now_ms, now_s, request_expires_ms, dedup (0/1),
-- prompt_history, capacity, forget_limit, request_digest, run_id, then (blob, meta) per
-- trajectory, where meta is "version bin reward digest prompt_id". Returns {status, first
-- result}: status 0 stored, 1 replayed, 2 the request id is kept with another digest, 3 the
-- batch's run is not the registered one (then the result is the registered run id, '' for
-- none; nothing stored). A
-- result is "accepted replaced evicted request_digest"; ids kept before digests were have no
-- digest and replay whatever comes. Mirrors MemoryStore.add_trajectories step for step.
local request_id, searcher_id, lease_id = ARGV[1], ARGV[2], ARGV[3]
local now_ms = ARGV[4]
local dedup = ARGV[7] == '1'
local history_cap, capacity = tonumber(ARGV[8]), tonumber(ARGV[9])
-- Once growth is frozen (freeze_growth.lua) the buffer holds at most what it held then.
local frozen = redis.call('HGET', key('state'), 'frozen_capacity')
if frozen then
  capacity = math.min(capacity, tonumber(frozen))
end
local request_digest = ARGV[11]
local first_pair = 13

local registered_run = redis.call('GET', key('run_id')) or ''
if registered_run ~= ARGV[12] then
  return {3, registered_run}
end

local expired = redis.call('ZRANGEBYSCORE', key('req_exp'), '-inf', now_ms, 'LIMIT', 0, ARGV[10])
for _, old in ipairs(expired) do
  redis.call('HDEL', key('req'), old)
  redis.call('ZREM', key('req_exp'), old)
end
local seen_until = redis.call('ZSCORE', key('req_exp'), request_id)
if seen_until and tonumber(now_ms) < tonumber(seen_until) then
  local first = redis.call('HGET', key('req'), request_id)
  local kept_digest = string.match(first, '^%S+ %S+ %S+ (%S+)$')
  if kept_digest and kept_digest ~= request_digest then
    return {2, first}
  end
  return {1, first}
end

local reward_sum = tonumber(redis.call('HGET', key('state'), 'reward_sum') or '0')
local replaced, evicted = 0, 0

local function parse(meta)
  return string.match(meta, '^(%S+) (%S+) (%S+) (%S+) (.+)$')
end

local function remove(id)
  local version, bin, reward, digest, prompt_id = parse(redis.call('HGET', key('meta'), id))
  local history, digests = key('h:' .. prompt_id), key('d:' .. prompt_id)
  redis.call('HDEL', key('meta'), id)
  redis.call('HDEL', key('blob'), id)
  redis.call('ZREM', history, id)
  if redis.call('HGET', digests, digest) == id then
    redis.call('HDEL', digests, digest)
  end
  if redis.call('HINCRBY', key('versions'), version, -1) <= 0 then
    redis.call('HDEL', key('versions'), version)
  end
  redis.call('HINCRBY', key('hist'), bin, -1)
  reward_sum = reward_sum - tonumber(reward)
  local first = redis.call('ZRANGE', history, 0, 0)[1]
  if first then
    redis.call('ZADD', key('oldest'), first, prompt_id)
  else
    redis.call('DEL', digests)
    redis.call('ZREM', key('recent'), prompt_id)
    redis.call('ZREM', key('oldest'), prompt_id)
    redis.call('ZREM', key('ranked'), prompt_id)
  end
end

local function insert(id, blob, meta)
  local version, bin, reward, digest, prompt_id = parse(meta)
  local history, digests = key('h:' .. prompt_id), key('d:' .. prompt_id)
  redis.call('HSET', key('blob'), id, blob)
  redis.call('HSET', key('meta'), id, meta)
  redis.call('ZADD', history, id, id)
  if dedup then
    redis.call('HSET', digests, digest, id)
  end
  local size = redis.call('ZCARD', history)
  if size == 1 then
    redis.call('ZADD', key('ranked'), 0, prompt_id)
    redis.call('ZADD', key('oldest'), id, prompt_id)
  end
  redis.call('ZADD', key('recent'), id, prompt_id)
  redis.call('HINCRBY', key('versions'), version, 1)
  redis.call('HINCRBY', key('hist'), bin, 1)
  reward_sum = reward_sum + tonumber(reward)
  return history, size
end

local function add(blob, meta)
  local id = int(redis.call('HINCRBY', key('state'), 'trajectory_seq', 1))
  if dedup then
    local _, _, _, digest, prompt_id = parse(meta)
    local old = redis.call('HGET', key('d:' .. prompt_id), digest)
    if old then
      remove(old)
      replaced = replaced + 1
    end
  end
  local history, size = insert(id, blob, meta)
  if size > history_cap then
    remove(redis.call('ZRANGE', history, 0, 0)[1])
    evicted = evicted + 1
  end
  if redis.call('HLEN', key('meta')) > capacity then
    local prompt_id = redis.call('ZRANGE', key('oldest'), 0, 0)[1]
    remove(redis.call('ZRANGE', key('h:' .. prompt_id), 0, 0)[1])
    evicted = evicted + 1
  end
end

local count = (#ARGV - first_pair + 1) / 2
for i = first_pair, #ARGV, 2 do
  add(ARGV[i], ARGV[i + 1])
end
redis.call('HSET', key('state'), 'reward_sum', string.format('%.17g', reward_sum))
redis.call('HINCRBY', key('state'), 'added_total', count)
redis.call('HINCRBY', key('state'), 'evicted_total', evicted)
redis.call('HINCRBY', key('added'), searcher_id, count)
redis.call('HSET', key('seen'), searcher_id, ARGV[5])
local result = int(count) .. ' ' .. int(replaced) .. ' ' .. int(evicted)
redis.call('HSET', key('req'), request_id, result .. ' ' .. request_digest)
redis.call('ZADD', key('req_exp'), ARGV[6], request_id)
if lease_id ~= '' then
  release_lease(lease_id, now_ms)
end
return {0, result}
