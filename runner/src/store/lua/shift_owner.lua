-- Shifts every scheduled task of one owner in this shard (optionally only one plugin's) by ±ms.
-- ARGV: channel, shard, owner, shift_ms, plugin ('' = all). Returns the number of tasks moved.
local channel, shard, owner, shift, plugin = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local members = redis.call('ZRANGEBYLEX', K_BYOWNER, '[' .. owner .. '\0', '(' .. owner .. '\1')
local moved = 0
local earliest = nil
for _, m in ipairs(members) do
  local id = string.match(m, '^[^%z]*%z%d+%z(.*)$')
  local t = parse(redis.call('HGET', K_TASKS, id))
  if t and t.st == 's' and (plugin == '' or t.plugin == plugin) then
    unindex_scheduled(id, t)
    t.due = math.max(t.due + shift, 0)
    redis.call('HSET', K_TASKS, id, encode(t))
    index_scheduled(id, t)
    moved = moved + 1
    if not earliest or t.due < earliest then earliest = t.due end
  elseif not t or t.st ~= 's' then
    redis.call('ZREM', K_BYOWNER, m) -- a stale index entry: repair
  end
end
if earliest then wake_if_head(channel, shard, earliest) end
return moved
