#!lua flags=allow-oom
-- Commits the kv writes and events of one handler run, all together or not at all, at most once
-- per marker, and only if none of the kv entries the run read has changed since it read them
-- (optimistic concurrency: two runs that race on one key behave as if one ran after the other).
-- All keys share the namespace hash tag {ns}. KEYS[1]: the marker of this run (task id + the
-- claim it commits under: its own, or the first of the claims before it that lost their lease
-- with no outcome recorded);
-- KEYS[2..]: the kv and stream keys the reads and ops name by index.
-- ARGV: marker_ttl_ms, stream_maxlen, n_reads, then per read: key_index, sha1 of the value read
-- ('' when it was absent); then ops:
--   'set', key_index, value, ttl_ms (0 = none) | 'del', key_index |
--   'emit', key_index, task_id, plugin, data |
--   'emit_tp', key_index, task_id, plugin, data, traceparent (the entry gets a traceparent field)
-- Returns 1 when applied, 0 when this marker's effects were applied before, -1 on a conflict (a key
-- read has changed: nothing was written; the handler must run again with fresh reads).
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local maxlen, n_reads = ARGV[2], tonumber(ARGV[3])
local i = 4
for _ = 1, n_reads do
  local v = redis.call('GET', KEYS[tonumber(ARGV[i])])
  local seen = ''
  if v then seen = redis.sha1hex(v) end
  if seen ~= ARGV[i + 1] then return -1 end
  i = i + 2
end
-- Check every op before writing anything: a script error after a write would leave half of them.
local ops, j = {}, i
while j <= #ARGV do
  local width = ({ set = 4, del = 2, emit = 5, emit_tp = 6 })[ARGV[j]]
  if not width then return redis.error_reply('unknown effect op ' .. tostring(ARGV[j])) end
  if ARGV[j] == 'set' and not tonumber(ARGV[j + 3]) then
    return redis.error_reply('bad ttl ' .. tostring(ARGV[j + 3]))
  end
  ops[#ops + 1] = j
  j = j + width
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
for _, at in ipairs(ops) do
  local op, key = ARGV[at], KEYS[tonumber(ARGV[at + 1])]
  if op == 'set' then
    local ttl = tonumber(ARGV[at + 3])
    if ttl > 0 then redis.call('SET', key, ARGV[at + 2], 'PX', ARGV[at + 3]) -- as sent: no float
    else redis.call('SET', key, ARGV[at + 2]) end
  elseif op == 'del' then
    redis.call('DEL', key)
  elseif op == 'emit' then
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*',
      'task_id', ARGV[at + 2], 'plugin', ARGV[at + 3], 'data', ARGV[at + 4])
  else
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*',
      'task_id', ARGV[at + 2], 'plugin', ARGV[at + 3], 'data', ARGV[at + 4],
      'traceparent', ARGV[at + 5])
  end
end
return 1
