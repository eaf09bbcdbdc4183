#!lua flags=allow-oom
-- Commits the kv writes and events of one handler run, all together or not at all, at most once
-- per marker, and only if none of the kv entries the run read has changed since it read them
-- (optimistic concurrency: two runs that race on one key behave as if one ran after the other).
-- All keys share the namespace hash tag {ns}. KEYS[1]: the marker of this run (task id + the
-- claim it commits under: its own, or the first of the claims before it that lost their lease
-- with no outcome recorded);
-- KEYS[2..]: the kv and stream keys the reads and ops name by index, the SET of the topics
-- the run's plugin has written and the bytes each of its streams holds (HASH stream key ->
-- bytes of its entries' fields and values) (the two named by the index of the first when the
-- run emits), and the plugin's kv index
-- (when the run writes kv): HASH kv key -> bytes (key and value), ZSET kv key -> when its TTL
-- ends (ms), STRING the bytes of all (named by the index of the first).
-- ARGV: marker_ttl_ms, stream_maxlen, max_topics, topics_key_index (0: the run emits nothing),
-- kv_index_key_index (0: the run writes no kv), max_kv_keys, max_kv_bytes, the length of the
-- plugin's kv key prefix, emitted_max_bytes,
-- n_reads, then per read: key_index, sha1 of the value read ('' when it was absent); then ops:
--   'set', key_index, value, ttl_ms (0 = none) | 'del', key_index |
--   'emit', key_index, topic, task_id, plugin, data |
--   'emit_tp', key_index, topic, task_id, plugin, data, traceparent (the entry gets a
--   traceparent field)
-- Returns 1 when applied, 0 when this marker's effects were applied before, -1 on a conflict (a key
-- read has changed: nothing was written; the handler must run again with fresh reads), -2 when
-- the events would take the plugin past max_topics topics, -3 when its kv writes would take it
-- past max_kv_keys keys or max_kv_bytes bytes (a run that adds neither is taken), -4 when its
-- events would not fit the plugin's emitted streams' emitted_max_bytes even with the oldest
-- entries of the streams it writes dropped; nothing was written but the index's forgetting of
-- entries whose TTL has passed.
-- A stream written keeps at most stream_maxlen entries, and the plugin's streams together at most
-- emitted_max_bytes: the streams a run writes drop their oldest entries to make room (a run's own
-- entries stay), the others keep theirs. Entries a stream held before its bytes were counted (a
-- 0.2.0 stream) count from when they are dropped, never below zero.
-- Bound: one run's effects, bounded by the run's budget (`--max-effect-bytes`, `--max-follow-ups`,
--  `--max-cancels`) and the kv bounds it checks; the entries a stream drops free at most the bytes
--  the run adds (and one entry per entry added past stream_maxlen), and an HGETALL of at most
--  max_topics fields.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local maxlen, max_topics, topics_ix = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local kv_ix, max_kv_keys, max_kv_bytes = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local prefix_len = tonumber(ARGV[8])
local emitted_max = tonumber(ARGV[9])
local n_reads = tonumber(ARGV[10])
local i = 11
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
-- The bytes of an entry: its fields' names and values (`fields` as XRANGE gives them).
local function entry_bytes(fields)
  local n = 0
  for _, f in ipairs(fields) do n = n + #f end
  return n
end
-- The plugin's emitted streams: what the run adds to each, and whether they fit.
local emitted, added, added_n, written, own, total = nil, {}, {}, {}, {}, 0
if topics then
  emitted = KEYS[topics_ix + 1]
  for _, at in ipairs(ops) do
    local op = ARGV[at]
    if op == 'emit' or op == 'emit_tp' then
      local key = KEYS[tonumber(ARGV[at + 1])]
      local n = #'task_id' + #ARGV[at + 3] + #'plugin' + #ARGV[at + 4] + #'data' + #ARGV[at + 5]
      if op == 'emit_tp' then n = n + #'traceparent' + #ARGV[at + 6] end
      if not added[key] then written[#written + 1] = key; added[key], added_n[key] = 0, 0 end
      added[key], added_n[key] = added[key] + n, added_n[key] + 1
    end
  end
  local kept, new = 0, 0
  local held = redis.call('HGETALL', emitted)
  for k = 1, #held, 2 do
    own[held[k]] = tonumber(held[k + 1])
    total = total + own[held[k]]
    if not added[held[k]] then kept = kept + own[held[k]] end
  end
  for _, key in ipairs(written) do new = new + added[key] end
  if kept + new > emitted_max then return -4 end
end
if #new_topics > 0 then
  if redis.call('SCARD', topics) + #new_topics > max_topics then return -2 end
  for _, topic in ipairs(new_topics) do redis.call('SADD', topics, topic) end
end
-- The kv index: what the sets and deletes make of the plugin's key count and bytes.
local sizes, expiry, total_key, now, size = nil, nil, nil, 0, {}
if kv_ix > 0 then
  sizes, expiry, total_key = KEYS[kv_ix], KEYS[kv_ix + 1], KEYS[kv_ix + 2]
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local total = tonumber(redis.call('GET', total_key) or '0')
  -- entries whose TTL has passed are gone: forgotten (a bounded number per commit)
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', expiry, '-inf', now, 'LIMIT', 0, 1000)) do
    total = total - tonumber(redis.call('HGET', sizes, k) or '0')
    redis.call('HDEL', sizes, k)
    redis.call('ZREM', expiry, k)
  end
  local count = redis.call('HLEN', sizes)
  local count0, total0 = count, total
  for _, at in ipairs(ops) do
    local op = ARGV[at]
    if op == 'set' or op == 'del' then
      local k = string.sub(KEYS[tonumber(ARGV[at + 1])], prefix_len + 1)
      local old = size[k]
      if old == nil then old = tonumber(redis.call('HGET', sizes, k) or '') or false end
      local new = op == 'set' and (#k + #ARGV[at + 2]) or false
      if old then count, total = count - 1, total - old end
      if new then count, total = count + 1, total + new end
      size[k] = new
    end
  end
  if (count > max_kv_keys and count > count0) or (total > max_kv_bytes and total > total0) then
    redis.call('SET', total_key, total0) -- what the forgetting above left
    return -3
  end
  redis.call('SET', total_key, total)
  for k, n in pairs(size) do
    if n then redis.call('HSET', sizes, k, n) else redis.call('HDEL', sizes, k) end
  end
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
for _, at in ipairs(ops) do
  local op, key = ARGV[at], KEYS[tonumber(ARGV[at + 1])]
  if op == 'set' then
    local ttl = tonumber(ARGV[at + 3])
    if ttl > 0 then redis.call('SET', key, ARGV[at + 2], 'PX', ARGV[at + 3]) -- as sent: no float
    else redis.call('SET', key, ARGV[at + 2]) end
    if expiry then
      local k = string.sub(key, prefix_len + 1)
      if ttl > 0 then redis.call('ZADD', expiry, now + ttl, k) else redis.call('ZREM', expiry, k) end
    end
  elseif op == 'del' then
    redis.call('DEL', key)
    if expiry then redis.call('ZREM', expiry, string.sub(key, prefix_len + 1)) end
  elseif op == 'emit' then
    redis.call('XADD', key, '*', 'task_id', ARGV[at + 3], 'plugin', ARGV[at + 4], 'data', ARGV[at + 5])
  else
    redis.call('XADD', key, '*', 'task_id', ARGV[at + 3], 'plugin', ARGV[at + 4], 'data', ARGV[at + 5],
      'traceparent', ARGV[at + 6])
  end
end
if emitted then
  -- each stream written: its bytes, then its oldest entries dropped while the plugin's streams
  -- pass emitted_max_bytes or it passes stream_maxlen (never the entries this run added)
  maxlen = tonumber(maxlen)
  for _, key in ipairs(written) do
    local mine = (own[key] or 0) + added[key]
    total = total + added[key]
    local len = redis.call('XLEN', key)
    -- a stream deleted or trimmed by hand holds no more than this run's entries
    if len == added_n[key] then total, mine = total - mine + added[key], added[key] end
    while (total > emitted_max or len > maxlen) and len > added_n[key] do
      local over = math.max(len - maxlen, 1)
      local oldest = redis.call('XRANGE', key, '-', '+', 'COUNT', math.min(math.max(over, 16), len - added_n[key]))
      local last
      for _, e in ipairs(oldest) do
        if not ((total > emitted_max or len > maxlen) and len > added_n[key]) then break end
        local n = entry_bytes(e[2])
        mine, total, len, last = mine - n, total - n, len - 1, e[1]
      end
      if not last then break end
      local ms, seq = string.match(last, '^(%d+)-(%d+)$')
      redis.call('XTRIM', key, 'MINID', '=', ms .. '-' .. string.format('%d', tonumber(seq) + 1))
    end
    redis.call('HSET', emitted, key, string.format('%d', math.max(mine, 0)))
  end
end
return 1
