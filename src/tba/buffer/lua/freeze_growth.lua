-- ARGV: capacity. Caps the trajectories held at what is held now (at least 1, at most
-- capacity), once: a later call returns the first cap. add_trajectories.lua evicts the
-- oldest beyond it as beyond the capacity. Mirrors MemoryStore.freeze_growth.
local frozen = redis.call('HGET', key('state'), 'frozen_capacity')
if frozen then
  return tonumber(frozen)
end
local cap = math.min(tonumber(ARGV[1]), math.max(redis.call('HLEN', key('meta')), 1))
redis.call('HSET', key('state'), 'frozen_capacity', int(cap))
return cap
