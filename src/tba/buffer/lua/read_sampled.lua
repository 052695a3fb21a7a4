-- ARGV: per group, its size, then its trajectory ids. Returns every id's blob in order
-- (false where it was evicted) and counts the groups that still have one as sampled.
-- Mirrors MemoryStore.read_sampled.
local blobs, sampled, at = {}, 0, 1
while at <= #ARGV do
  local size = tonumber(ARGV[at])
  local found = false
  for i = at + 1, at + size do
    local blob = redis.call('HGET', key('blob'), ARGV[i])
    blobs[#blobs + 1] = blob
    found = found or blob ~= false
  end
  if found then
    sampled = sampled + 1
  end
  at = at + size + 1
end
if sampled > 0 then
  redis.call('HINCRBY', key('state'), 'groups_total', sampled)
end
return blobs
