-- ARGV: run_id, the run as JSON. Records the run when none is registered. Returns the
-- registered run's JSON: this one, or the one registered before, unchanged.
local current = redis.call('GET', key('run'))
if current then
  return current
end
redis.call('SET', key('run'), ARGV[2])
redis.call('SET', key('run_id'), ARGV[1])
return ARGV[2]
