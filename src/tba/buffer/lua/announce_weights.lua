-- ARGV: version, uri, sha256, step, published_at_s. Returns {1} when recorded, or
-- {0, latest version} when the version is not newer than the latest one.
local latest = redis.call('HGET', key('weights'), 'version')
if latest and tonumber(latest) >= tonumber(ARGV[1]) then
  return {0, latest}
end
redis.call('HSET', key('weights'), 'version', ARGV[1], 'uri', ARGV[2], 'sha256', ARGV[3],
  'step', ARGV[4], 'published_at_s', ARGV[5])
return {1}
