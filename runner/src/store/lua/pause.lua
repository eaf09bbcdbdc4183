-- Pauses or resumes one plugin in this shard.
-- ARGV: channel, shard, op ('pause' | 'resume'), plugin, cursor ('' = start), limit.
-- 'pause' marks the plugin paused: from then on claims park its due tasks (out of `due`, still
-- scheduled, no attempt used) and new ones are indexed as parked. Returns {0, ''}.
-- 'resume' unmarks it and moves up to `limit` of its parked tasks back to `due`, walking the
-- plugin index after `cursor` (called again with the returned cursor until it is '').
-- Returns {moved, next cursor}.
local channel, shard, op, plugin, cursor, limit = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
  tonumber(ARGV[6])
local mark = '\0' .. plugin .. '\0'
local list = redis.call('HGET', K_META, 'paused') or ''
local at = string.find(list, mark, 1, true)
if op == 'pause' then
  if not at then
    if list == '' then list = mark else list = list .. plugin .. '\0' end
    redis.call('HSET', K_META, 'paused', list)
  end
  return { 0, '' }
end
if at then
  list = string.sub(list, 1, at) .. string.sub(list, at + #mark)
  if list == '\0' then
    redis.call('HDEL', K_META, 'paused')
  else
    redis.call('HSET', K_META, 'paused', list)
  end
end
local lo = '[' .. plugin .. '\0s\0'
if cursor ~= '' then lo = '(' .. cursor end
local members = redis.call('ZRANGEBYLEX', K_BYPLUGIN, lo, '(' .. plugin .. '\0s\1', 'LIMIT', 0, limit)
local moved, earliest = 0, nil
for _, m in ipairs(members) do
  local id = string.match(m, '^[^%z]*%z.%z[^%z]*%z(.*)$')
  local due = tonumber(redis.call('ZSCORE', K_PARKED, id))
  if due then
    redis.call('ZREM', K_PARKED, id)
    redis.call('ZADD', K_DUE, due, id)
    moved = moved + 1
    if not earliest or due < earliest then earliest = due end
  end
end
if earliest then wake_if_head(channel, shard, earliest) end
return chunk_done(moved, members, limit)
