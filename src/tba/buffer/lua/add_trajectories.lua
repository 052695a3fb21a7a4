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
-- Redis time per command dominates a script's cost, so what many trajectories of the batch
-- would write one by one is kept here and written once at the end: the new trajectories' blob
-- and meta fields, the deleted ones, the per-version and per-bin counts, the recency keys.
-- Reads go through these first, so each step sees what the one-by-one order would have seen.
local new_blob, new_meta, deleted = {}, {}, {}
local version_delta, bin_delta, newest_of = {}, {}, {}
local sizes = {}
local stored = redis.call('HLEN', key('meta'))

local function history_size(prompt_id)
  if not sizes[prompt_id] then
    sizes[prompt_id] = redis.call('ZCARD', key('h:' .. prompt_id))
  end
  return sizes[prompt_id]
end

local function count_in(deltas, field, by)
  deltas[field] = (deltas[field] or 0) + by
end

-- A prompt's place in the recency window: its newest policy version, then its newest id, as
-- fixed-width digits, so that `recency` (all scores 0) orders its members by them.
local function recency_key(version, id)
  return string.format('%012d:%020d:', tonumber(version), tonumber(id))
end

local function forget_recency(prompt_id)
  local kept = redis.call('HGET', key('recency_of'), prompt_id)
  if kept then
    redis.call('ZREM', key('recency'), kept .. prompt_id)
    redis.call('HDEL', key('recency_of'), prompt_id)
  end
end

-- `next_first`: the history's oldest id once `id` is gone, when the caller read it already.
local function remove(id, next_first)
  local meta = new_meta[id]
  if meta then
    new_meta[id], new_blob[id] = nil, nil
  else
    meta = redis.call('HGET', key('meta'), id)
    deleted[#deleted + 1] = id
  end
  local version, bin, reward, digest, prompt_id = parse_meta(meta)
  local history, digests = key('h:' .. prompt_id), key('d:' .. prompt_id)
  local size = history_size(prompt_id) - 1
  redis.call('ZREM', history, id)
  if redis.call('HGET', digests, digest) == id then
    redis.call('HDEL', digests, digest)
  end
  count_in(version_delta, version, -1)
  count_in(bin_delta, bin, -1)
  reward_sum = reward_sum - tonumber(reward)
  stored = stored - 1
  sizes[prompt_id] = size
  if size > 0 then
    local first = next_first or redis.call('ZRANGE', history, 0, 0)[1]
    redis.call('ZADD', key('oldest'), first, prompt_id)
  else
    newest_of[prompt_id] = nil
    forget_recency(prompt_id)
    redis.call('DEL', digests)
    redis.call('ZREM', key('oldest'), prompt_id)
    redis.call('ZREM', key('ranked'), prompt_id)
  end
end

local function remove_oldest(prompt_id)
  local two = redis.call('ZRANGE', key('h:' .. prompt_id), 0, 1)
  remove(two[1], two[2])
  evicted = evicted + 1
end

local function insert(id, blob, meta)
  local version, bin, reward, digest, prompt_id = parse_meta(meta)
  local size = history_size(prompt_id) + 1
  new_blob[id], new_meta[id] = blob, meta
  redis.call('ZADD', key('h:' .. prompt_id), id, id)
  if dedup then
    redis.call('HSET', key('d:' .. prompt_id), digest, id)
  end
  sizes[prompt_id] = size
  if size == 1 then
    redis.call('ZADD', key('ranked'), 0, prompt_id)
    redis.call('ZADD', key('oldest'), id, prompt_id)
  end
  local newest = recency_key(version, id)
  if not newest_of[prompt_id] or newest > newest_of[prompt_id] then
    newest_of[prompt_id] = newest
  end
  count_in(version_delta, version, 1)
  count_in(bin_delta, bin, 1)
  reward_sum = reward_sum + tonumber(reward)
  stored = stored + 1
  return prompt_id, size
end

local function add(id, blob, meta)
  if dedup then
    local _, _, _, digest, prompt_id = parse_meta(meta)
    local old = redis.call('HGET', key('d:' .. prompt_id), digest)
    if old then
      remove(old)
      replaced = replaced + 1
    end
  end
  local prompt_id, size = insert(id, blob, meta)
  if size > history_cap then
    remove_oldest(prompt_id)
  end
  if stored > capacity then
    remove_oldest(redis.call('ZRANGE', key('oldest'), 0, 0)[1])
  end
end

-- Lua's unpack takes a few thousand values at most: long lists go in chunks.
local function call_chunked(command, target, values)
  for first = 1, #values, 1000 do
    redis.call(command, target, unpack(values, first, math.min(first + 999, #values)))
  end
end

local function push_pair(list, first, second)
  list[#list + 1] = first
  list[#list + 1] = second
end

-- A prompt moves up the recency window only: completions of an older version than its newest
-- leave it where it is.
local function write_recency()
  for prompt_id, newest in pairs(newest_of) do
    local kept = redis.call('HGET', key('recency_of'), prompt_id)
    if not kept or newest > kept then
      if kept then
        redis.call('ZREM', key('recency'), kept .. prompt_id)
      end
      redis.call('ZADD', key('recency'), 0, newest .. prompt_id)
      redis.call('HSET', key('recency_of'), prompt_id, newest)
    end
  end
end

local function write_pending()
  local blobs, metas = {}, {}
  for id, meta in pairs(new_meta) do
    push_pair(blobs, id, new_blob[id])
    push_pair(metas, id, meta)
  end
  call_chunked('HSET', key('blob'), blobs)
  call_chunked('HSET', key('meta'), metas)
  call_chunked('HDEL', key('blob'), deleted)
  call_chunked('HDEL', key('meta'), deleted)
  write_recency()
  for version, delta in pairs(version_delta) do
    if delta ~= 0 and redis.call('HINCRBY', key('versions'), version, delta) <= 0 then
      redis.call('HDEL', key('versions'), version)
    end
  end
  for bin, delta in pairs(bin_delta) do
    redis.call('HINCRBY', key('hist'), bin, delta)
  end
end

local count = (#ARGV - first_pair + 1) / 2
local id = redis.call('HINCRBY', key('state'), 'trajectory_seq', count) - count
for i = first_pair, #ARGV, 2 do
  id = id + 1
  add(int(id), ARGV[i], ARGV[i + 1])
end
write_pending()
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
