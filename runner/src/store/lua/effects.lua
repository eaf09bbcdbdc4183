#!lua flags=allow-oom
-- Commits the kv writes and events of one handler run, all together or not at all, at most once
-- per marker, and only if none of the kv entries the run read has changed since it read them
-- (optimistic concurrency: two runs that race on one key behave as if one ran after the other).
-- All keys share the namespace hash tag {ns}. KEYS[1]: the marker of this run (task id + the
-- claim it commits under: its own, or the first of the claims before it that lost their lease
-- with no outcome recorded);
-- KEYS[2..]: the kv and stream keys the reads and ops name by index, and the SET of the topics
-- the run's plugin has written (named by index when the run emits).
-- ARGV: marker_ttl_ms, stream_maxlen, max_topics, topics_key_index (0: the run emits nothing),
-- n_reads, then per read: key_index, sha1 of the value read ('' when it was absent); then ops:
--   'set', key_index, value, ttl_ms (0 = none) | 'del', key_index |
--   'emit', key_index, topic, task_id, plugin, data |
--   'emit_tp', key_index, topic, task_id, plugin, data, traceparent (the entry gets a
--   traceparent field)
-- Returns 1 when applied, 0 when this marker's effects were applied before, -1 on a conflict (a key
-- read has changed: nothing was written; the handler must run again with fresh reads), -2 when
-- the events would take the plugin past max_topics topics (nothing was written).
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local maxlen, max_topics, topics_ix = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local n_reads = tonumber(ARGV[5])
local i = 6
for _ = 1, n_reads do
  local v = redis.call('GET', KEYS[tonumber(ARGV[i])])
  local seen = ''
  if v then seen = redis.sha1hex(v) end
  if seen ~= ARGV[i + 1] then return -1 end
  i = i + 2
end
-- Check every op before writing anything: a script error after a write would leave half of them.
local ops, j, new_topics = {}, i, {}
local topics = topics_ix > 0 and KEYS[topics_ix]
while j <= #ARGV do
  local op = ARGV[j]
  local width = ({ set = 4, del = 2, emit = 6, emit_tp = 7 })[op]
  if not width then return redis.error_reply('unknown effect op ' .. tostring(op)) end
  if op == 'set' and not tonumber(ARGV[j + 3]) then
    return redis.error_reply('bad ttl ' .. tostring(ARGV[j + 3]))
  end
  if (op == 'emit' or op == 'emit_tp') and topics then
    local topic = ARGV[j + 2]
    if not new_topics[topic] and redis.call('SISMEMBER', topics, topic) == 0 then
      new_topics[topic] = true
      new_topics[#new_topics + 1] = topic
    end
  end
  ops[#ops + 1] = j
  j = j + width
end
if #new_topics > 0 then
  if redis.call('SCARD', topics) + #new_topics > max_topics then return -2 end
  for _, topic in ipairs(new_topics) do redis.call('SADD', topics, topic) end
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
      'task_id', ARGV[at + 3], 'plugin', ARGV[at + 4], 'data', ARGV[at + 5])
  else
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*',
      'task_id', ARGV[at + 3], 'plugin', ARGV[at + 4], 'data', ARGV[at + 5],
      'traceparent', ARGV[at + 6])
  end
end
return 1
