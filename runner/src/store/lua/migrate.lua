-- Brings one shard's indexes up to the current key layout, a chunk at a time. Idempotent, and
-- safe to run from several runners at once; every script since keeps the indexes in step, so a
-- shard is walked once. Three steps, each recorded in the shard's meta 'layout' when it ends:
--   '3': the plugin index (`byplugin`) gets the scheduled and dead tasks written before it
--        existed (walking `tasks` with HSCAN; cursor 'h<hscan cursor>').
--   '4': the scheduled tasks leave the plugin index for per-plugin counts in `scheduled`
--        (walking `byplugin` in order; cursor 'z<the last member looked at>'). An entry is
--        counted by the script that removes it, so a task is counted once whoever walks.
--   '5': the due times leave the one `due` ZSET for the due buckets (walking `due` from its
--        first rank, each chunk taken out of it; cursor 'd'). An entry goes in at its record's
--        due time (the buckets find a task by it); one without a scheduled record is dropped.
--        Also run at a later start if `due` is not empty: a runner of an earlier build, still
--        running beside upgraded ones, may have scheduled into it.
-- Step 3 runs only while the layout is before 3, so no entry is added once step 4 has begun.
-- ARGV: layout (the version this migration reaches), cursor ('0' = start), count.
-- Returns the next cursor ('0' when done).
local layout, cursor, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local at = tonumber(redis.call('HGET', K_META, 'layout')) or 0
if at >= tonumber(layout) and redis.call('EXISTS', K_DUE) == 0 then return '0' end
if at >= 4 then
  local page = redis.call('ZRANGE', K_DUE, '0', string.format('%d', count - 1))
  local recs, back = records_of(page), {}
  for i, id in ipairs(page) do
    local due = recs[i] and string.match(recs[i], '^s\t(%-?%d+)\t')
    if due then push(back, due, id) end
  end
  if #page > 0 then redis.call('ZREMRANGEBYRANK', K_DUE, '0', string.format('%d', #page - 1)) end
  due_add(back)
  if #page == count then return 'd' end
  redis.call('HSET', K_META, 'layout', layout)
  return '0'
end
if at < 3 then
  local r = redis.call('HSCAN', K_TASKS, string.match(cursor, '^h(%d+)$') or '0', 'COUNT', count)
  local kv = r[2]
  for i = 1, #kv, 2 do
    local id, t = kv[i], parse(kv[i + 1])
    if t and t.st == 's' then
      redis.call('ZADD', K_BYPLUGIN, 0, plugin_member(t.plugin, 's', t.due, id))
    elseif t and t.st == 'x' then
      redis.call('ZADD', K_BYPLUGIN, 0, plugin_member(t.plugin, 'x', died_at(t), id))
    end
  end
  if r[1] ~= '0' then return 'h' .. r[1] end
  redis.call('HSET', K_META, 'layout', '3')
  return 'z'
end
local last = string.match(cursor, '^z(.+)$')
local from = '-'
if last then from = '(' .. last end
local members = redis.call('ZRANGEBYLEX', K_BYPLUGIN, from, '+', 'LIMIT', 0, count)
-- (one script: every member just read is there to remove, so each is counted once)
local listed, plugins, dues, ids = {}, {}, {}, {}
for _, m in ipairs(members) do
  local plugin, kind, due, id = string.match(m, '^([^%z]*)%z(.)%z(%d+)%z(.*)$')
  if kind == 's' then
    listed[#listed + 1] = m
    plugins[#listed], dues[#listed], ids[#listed] = plugin, tonumber(due), id
  end
end
local recs, counts = records_of(ids), {}
for i, rec in ipairs(recs) do
  -- a stale entry (its task gone, or not scheduled so) is dropped uncounted
  local due, plugin
  if rec then due, plugin = string.match(rec, '^s\t(%-?%d+)\t%d+\t%d+\t%d+\t%d*\t([^\t]*)\t') end
  if plugin == plugins[i] and tonumber(due) == dues[i] then
    counts[plugin] = (counts[plugin] or 0) + 1
  end
end
call_many('ZREM', K_BYPLUGIN, listed)
for plugin, k in pairs(counts) do count_scheduled(plugin, k) end
if #members == count then return 'z' .. members[#members] end
redis.call('HSET', K_META, 'layout', '4')
return 'd'
