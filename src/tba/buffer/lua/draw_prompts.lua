-- ARGV: window, wanted_recent, recent_candidates, max_age_versions (-1: none), min_version
-- (-1: none), R, R recency uniforms, P, P reward uniforms, excluded ids.
-- Chooses a draw's prompts as sampling.choose_prompts does, in one round trip with what the
-- draw reads next: the candidates sampling.usable_candidates reads. Returns {latest weight
-- version, {prompt ids}, {1 recency / 0 reward per prompt}, {{trajectory ids, oldest
-- first}, {their meta}} per prompt, {prompt blobs}}.
local function rank_of(u, n)
  return math.min(math.max(math.floor(tonumber(u) * n), 0), n - 1)
end

-- The first `count` items of a Fisher-Yates shuffle driven by ARGV[first], ARGV[first + 1]...
local function uniform_prefix(items, first, count)
  local shuffled = {}
  for i, item in ipairs(items) do
    shuffled[i] = item
  end
  local picked = {}
  for i = 1, math.min(count, #shuffled) do
    local j = i + rank_of(ARGV[first + i - 1], #shuffled - i + 1)
    shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
    picked[i] = shuffled[i]
  end
  return picked
end

local wanted_recent, n_recent = tonumber(ARGV[2]), tonumber(ARGV[6])
local recent_candidates = tonumber(ARGV[3])
local latest = redis.call('HGET', key('weights'), 'version') or '0'
-- sampling.candidate_floor
local max_age, floor = tonumber(ARGV[4]), tonumber(ARGV[5])
if floor < 0 then
  floor = max_age < 0 and 0 or math.max(0, tonumber(latest) - max_age)
end
local wanted_reward = n_recent - wanted_recent
local reward_at = 8 + n_recent
local n_reward = tonumber(ARGV[reward_at - 1])
local taken = {}
for i = reward_at + n_reward, #ARGV do
  taken[ARGV[i]] = true
end
-- The window: prompts by newest policy version, then newest id (add_trajectories.lua's
-- recency keys, 34 characters before the prompt id).
local window = {}
if tonumber(ARGV[1]) > 0 then
  for _, member in ipairs(redis.call('ZREVRANGE', key('recency'), 0, int(ARGV[1] - 1))) do
    local prompt_id = string.sub(member, 35)
    if not taken[prompt_id] then
      window[#window + 1] = prompt_id
    end
  end
end

local recent = uniform_prefix(window, 7, math.min(wanted_recent, n_recent))
for _, prompt_id in ipairs(recent) do
  taken[prompt_id] = true
end
local reward = {}
local n = redis.call('ZCARD', key('ranked'))
for i = reward_at, reward_at + n_reward - 1 do
  if #reward >= wanted_reward or n == 0 then
    break
  end
  local rank = int(rank_of(ARGV[i], n))
  local prompt_id = redis.call('ZRANGE', key('ranked'), rank, rank)[1]
  if not taken[prompt_id] then
    reward[#reward + 1] = prompt_id
    taken[prompt_id] = true
  end
end
local rest = {}
for _, prompt_id in ipairs(window) do
  if not taken[prompt_id] then
    rest[#rest + 1] = prompt_id
  end
end

local ids, flags, found, blobs = {}, {}, {}, {}
-- sampling.usable_candidates: newest first, those of version `floor` or newer, a
-- recency-chosen prompt's only up to `recent_candidates`.
local function choose(prompt_id, flag)
  local history = redis.call('ZRANGE', key('h:' .. prompt_id), 0, -1)
  local limit = flag == 1 and recent_candidates or 0
  local usable, metas = {}, {}
  for j = #history, 1, -1 do
    local meta = redis.call('HGET', key('meta'), history[j])
    if floor == 0 or tonumber((parse_meta(meta))) >= floor then
      usable[#usable + 1], metas[#usable + 1] = history[j], meta
      if #usable == limit then
        break
      end
    end
  end
  local n = #usable
  for j = 1, math.floor(n / 2) do  -- oldest first
    usable[j], usable[n + 1 - j] = usable[n + 1 - j], usable[j]
    metas[j], metas[n + 1 - j] = metas[n + 1 - j], metas[j]
  end
  ids[#ids + 1] = prompt_id
  flags[#ids], found[#ids] = flag, {usable, metas}
  blobs[#ids] = redis.call('HGET', key('prompts'), prompt_id)
end
for _, prompt_id in ipairs(recent) do
  choose(prompt_id, 1)
end
for _, prompt_id in ipairs(uniform_prefix(rest, 7 + wanted_recent, wanted_reward - #reward)) do
  choose(prompt_id, 1)
end
for _, prompt_id in ipairs(reward) do
  choose(prompt_id, 0)
end
return {latest, ids, flags, found, blobs}
