-- ARGV: prompt ids. Returns per prompt {{trajectory ids, oldest first}, {their meta}}.
local found = {}
for i = 1, #ARGV do
  local ids = redis.call('ZRANGE', key('h:' .. ARGV[i]), 0, -1)
  local metas = {}
  for j, id in ipairs(ids) do
    metas[j] = redis.call('HGET', key('meta'), id)
  end
  found[i] = {ids, metas}
end
return found
