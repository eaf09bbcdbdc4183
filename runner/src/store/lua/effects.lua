-- Applies the kv writes and events of one handler run, at most once per (task, attempt).
-- All keys share the namespace hash tag {ns}. KEYS[1]: the marker of this run; KEYS[2..]: the
-- kv and stream keys the ops name by index. ARGV: marker_ttl_ms, stream_maxlen, then ops:
--   'set', key_index, value, ttl_ms (0 = none) | 'del', key_index |
--   'emit', key_index, task_id, plugin, data
-- Returns 1 when applied, 0 when this run's effects were applied before.
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) == false then return 0 end
local maxlen = ARGV[2]
local i = 3
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'set' then
    local ttl = tonumber(ARGV[i + 3])
    if ttl > 0 then redis.call('SET', KEYS[tonumber(ARGV[i + 1])], ARGV[i + 2], 'PX', ttl)
    else redis.call('SET', KEYS[tonumber(ARGV[i + 1])], ARGV[i + 2]) end
    i = i + 4
  elseif op == 'del' then
    redis.call('DEL', KEYS[tonumber(ARGV[i + 1])])
    i = i + 2
  elseif op == 'emit' then
    redis.call('XADD', KEYS[tonumber(ARGV[i + 1])], 'MAXLEN', '~', maxlen, '*',
      'task_id', ARGV[i + 2], 'plugin', ARGV[i + 3], 'data', ARGV[i + 4])
    i = i + 5
  else
    return redis.error_reply('unknown effect op ' .. op)
  end
end
return 1
