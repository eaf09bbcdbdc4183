-- Brings one shard's indexes up to the current key layout, a chunk at a time: the plugin index
-- (`byplugin`) for scheduled and dead tasks written before it existed. Idempotent; every script
-- since keeps the index in step, so a shard is walked once.
-- ARGV: layout (the version this migration reaches), HSCAN cursor, count.
-- Returns the next cursor ('0' when done, and the shard's meta then records the layout).
local layout, cursor, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('HGET', K_META, 'layout') == layout then return '0' end
local r = redis.call('HSCAN', K_TASKS, cursor, 'COUNT', count)
local kv = r[2]
for i = 1, #kv, 2 do
  local id, t = kv[i], parse(kv[i + 1])
  if t and t.st == 's' then
    redis.call('ZADD', K_BYPLUGIN, 0, plugin_member(t.plugin, 's', t.due, id))
  elseif t and t.st == 'x' then
    redis.call('ZADD', K_BYPLUGIN, 0, plugin_member(t.plugin, 'x', died_at(t), id))
  end
end
if r[1] == '0' then redis.call('HSET', K_META, 'layout', layout) end
return r[1]
