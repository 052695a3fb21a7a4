-- ARGV: new_prompt_ms_base, then (id, blob) per prompt; an empty id gets "p" .. counter.
-- An existing id is left as it is. Returns {created, {ids in request order}}.
local base = tonumber(ARGV[1])
local created = 0
local ids = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if id == '' then
    repeat
      id = 'p' .. int(redis.call('HINCRBY', key('state'), 'prompt_seq', 1))
    until redis.call('HEXISTS', key('prompts'), id) == 0
  end
  if redis.call('HSETNX', key('prompts'), id, ARGV[i + 1]) == 1 then
    created = created + 1
    local sequence = redis.call('HINCRBY', key('state'), 'pool_seq', 1)
    redis.call('ZADD', key('pool'), int(base + sequence), id)
  end
  ids[#ids + 1] = id
end
return {created, ids}
