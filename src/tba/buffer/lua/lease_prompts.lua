-- ARGV: searcher_id, max_prompts, now_ms, expires_ms, now_s, forget_limit.
-- Returns {} when no prompt is available, else {lease_id, {prompt ids}, {prompt blobs}}.
local now_ms, expires_ms = ARGV[3], ARGV[4]
redis.call('HSET', key('seen'), ARGV[1], ARGV[5])
-- A few expired leases per call are forgotten: each call adds at most one.
local expired = redis.call('ZRANGEBYSCORE', key('lease_exp'), '-inf', now_ms, 'LIMIT', 0, ARGV[6])
for _, lease_id in ipairs(expired) do
  release_lease(lease_id, nil)
end
local taken = redis.call('ZRANGEBYSCORE', key('pool'), '-inf', now_ms, 'LIMIT', 0, ARGV[2])
if #taken == 0 then
  return {}
end
local lease_id = 'l' .. int(redis.call('HINCRBY', key('state'), 'lease_seq', 1))
local blobs = {}
for i, prompt_id in ipairs(taken) do
  redis.call('ZADD', key('pool'), expires_ms, prompt_id)
  redis.call('HSET', key('lease_of'), prompt_id, lease_id)
  blobs[i] = redis.call('HGET', key('prompts'), prompt_id)
end
redis.call('HSET', key('leases'), lease_id, expires_ms .. ' ' .. table.concat(taken, ' '))
redis.call('ZADD', key('lease_exp'), expires_ms, lease_id)
return {lease_id, taken, blobs}
