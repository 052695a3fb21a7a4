-- ARGV: uniforms in [0, 1). Returns, for each u, the prompt at rank floor(u * n) of the n
-- prompts that have trajectories ({} when there are none).
local n = redis.call('ZCARD', key('ranked'))
local found = {}
if n == 0 then
  return found
end
for i = 1, #ARGV do
  local rank = math.min(math.max(math.floor(tonumber(ARGV[i]) * n), 0), n - 1)
  found[i] = redis.call('ZRANGE', key('ranked'), int(rank), int(rank))[1]
end
return found
