#!lua flags=allow-oom
--! needs indexes walk extras far
-- Acts on many tasks of one shard in chunks: each run handles at most `limit` index entries, so
-- Redis is held only briefly; the caller runs it again with the returned cursor until it is ''.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, op, owner, plugin ('' = any), cursor ('' = start), limit.
--   'cancel_owner': cancels the owner's scheduled tasks (of `plugin`), walking the owner index
--                   after `cursor` (running tasks are left alone).
--   'retry_dead':   puts dead tasks (of `plugin`) back: due now, attempts reset (those dead when
--                   its first call ran: the cursor carries that time).
--   'drop_dead':    deletes dead tasks (of `plugin`).
--   'expire_dead':  deletes dead tasks that died before `owner` (ms: the argument carries the
--                   bound for this op).
--   'cancel_plugin': deletes the scheduled (parked included), dead and done tasks of `plugin`
--                   with their logs, listeners and dedup windows (a plugin deleted leaves
--                   nothing of its tasks to the next owner of its name), walking the shard's
--                   records with HSCAN from `cursor` (a plugin's scheduled tasks have no index
--                   of their own), after bringing its far tasks back (see `far`); running
--                   tasks are left alone.
-- Returns {count, next cursor}.
-- Bound: at most `limit` index entries per call (the caller's chunk, `BULK_CHUNK`), each task's own
--  record and window; a cancel of the owner's or the plugin's tasks also stops once the tasks and
--  the listeners they let go (a message each) reach `limit`; the plugin's and the dead letters'
--  ops at CANCEL_BYTES of records too.
-- The most bytes of records one call deletes or puts back, past its first ('cancel_plugin' and
-- the dead letters' ops).
local CANCEL_BYTES = 262144
local channel, shard, op, owner, plugin, cursor, limit = ARGV[1], ARGV[2], ARGV[3], ARGV[4],
  ARGV[5], ARGV[6], tonumber(ARGV[7])
local count, earliest = 0, nil
local now = now_ms()
local members
-- Deletes a scheduled or dead task with all it holds (`forget`: its listeners go too); returns
-- the work it was: 1, and 1 for each listener it let go.
local function delete_task(id, t) return 1 + forget(id, t, now) end
if op == 'cancel_owner' then
  local lo = '[' .. owner .. '\0'
  if cursor ~= '' then lo = '(' .. cursor end
  members = redis.call('ZRANGEBYLEX', K_BYOWNER, lo, '(' .. owner .. '\1', 'LIMIT', 0, limit)
  local work = 0
  for i, m in ipairs(members) do
    local id = string.match(m, '^[^%z]*%z[^%z]*%z(.*)$')
    local t = parse(redis.call('HGET', K_TASKS, id))
    if t and t.st == 's' and t.owner == owner then
      if plugin == '' or t.plugin == plugin then
        work = work + delete_task(id, t)
        count = count + 1
      end
    else
      redis.call('ZREM', K_BYOWNER, m) -- a stale index entry: repair
    end
    -- listening tasks weigh more: the next chunk goes on after this member
    if work >= limit and i < #members then return { count, m } end
  end
  return chunk_done(count, members, limit)
end
if op == 'cancel_plugin' then
  -- first the plugin's far slots come back into the live tier (a cursor 'f<ZSCAN cursor>'), at
  -- most CANCEL_BYTES of them a call past the first (a page cut short is scanned again: the
  -- slots moved are gone from it); then its records go
  if cursor == '' then cursor = far_in_use() and 'f0' or '0' end
  if string.sub(cursor, 1, 1) == 'f' then
    -- (a plugin's name is [a-z0-9-]: nothing in it is a pattern's)
    local r = redis.call('ZSCAN', far_slots_key(), string.sub(cursor, 2), 'MATCH', plugin .. '\31*', 'COUNT', 16)
    local bytes = 0
    for i = 1, #r[2], 2 do
      if bytes >= CANCEL_BYTES then return {0, cursor} end
      bytes = bytes + redis.call('STRLEN', far_list_key(r[2][i]))
      far_promote_slot(r[2][i])
    end
    if r[1] == '0' then return {0, '0'} end
    return {0, 'f' .. r[1]}
  end
  -- (a page brings every record's value, other plugins' too: a tenth of `limit` a page)
  local r = redis.call('HSCAN', K_TASKS, cursor, 'COUNT', math.max(1, math.floor(limit / 10)))
  local fields = r[2]
  local work, bytes, own = 0, 0, plugin .. '\31'
  for i = 1, #fields, 2 do
    local id, rec = fields[i], fields[i + 1]
    -- another plugin's task by its key, unread (a bare id of 0.1.0 is read to know)
    local sep = string.find(id, '\31', 1, true)
    if not sep or string.sub(id, 1, sep) == own then
      local t = parse(rec)
      if t and t.plugin == plugin and t.st ~= 'r' then
        -- past CANCEL_BYTES of records or `limit` of work, the rest of this page is the next
        -- call's: it scans the same page again (what this call deleted is gone from it)
        if count > 0 and (work >= limit or bytes + #rec > CANCEL_BYTES) then
          return {count, cursor}
        end
        work = work + delete_task(id, t)
        bytes = bytes + #rec
        redis.call('ZREM', K_UNIQUE, id)
        count = count + 1
      end
    end
  end
  if r[1] == '0' then return {count, ''} end
  return {count, r[1]}
end
-- dead tasks: each one handled leaves the dead indexes, so every chunk starts at the front; a
-- retry takes only those dead when it began (its first call's time, carried as its cursor), so
-- tasks it puts back that die again are not taken again and again
local ids = {}
local upto = nil
if op == 'retry_dead' then upto = tonumber(cursor) or now end
if plugin ~= '' then
  local hi = '(' .. plugin .. '\0x\1'
  if upto then hi = '(' .. dead_member(plugin, upto + 1, '') end
  members = redis.call('ZRANGEBYLEX', K_BYPLUGIN, '[' .. plugin .. '\0x\0', hi, 'LIMIT', 0, limit)
  for i, m in ipairs(members) do ids[i] = string.match(m, '^[^%z]*%z.%z[^%z]*%z(.*)$') end
elseif op == 'expire_dead' then
  ids = redis.call('ZRANGEBYSCORE', K_DEAD, '-inf', '(' .. owner, 'LIMIT', 0, limit)
elseif upto then
  ids = redis.call('ZRANGEBYSCORE', K_DEAD, '-inf', string.format('%d', upto), 'LIMIT', 0, limit)
else
  ids = redis.call('ZRANGE', K_DEAD, 0, limit - 1)
end
local bytes = 0
for i, id in ipairs(ids) do
  local rec = redis.call('HGET', K_TASKS, id)
  -- past CANCEL_BYTES of records the rest are the next call's (it starts at the front again)
  if count > 0 and rec and bytes + #rec > CANCEL_BYTES then
    if earliest then wake_if_head(channel, shard, earliest) end
    return { count, upto and string.format('%d', upto) or ids[i] }
  end
  bytes = bytes + (rec and #rec or 0)
  local t = parse(rec)
  if t and t.st == 'x' then
    if op == 'retry_dead' then
      unindex_dead(id, t)
      t.st = 's'; t.att = 0; t.fin = ''; t.err = ''; t.due = now; t.created = string.format('%d', now)
      redis.call('HSET', K_TASKS, id, encode(t))
      index_scheduled(id, t)
      earliest = now
    else
      delete_task(id, t)
    end
    count = count + 1
  elseif members then
    redis.call('ZREM', K_BYPLUGIN, members[i]) -- a stale index entry: repair
  else
    redis.call('ZREM', K_DEAD, id)
  end
end
if earliest then wake_if_head(channel, shard, earliest) end
-- (dead chunks start at the front: the cursor only says there is more, or a retry's time)
local r = chunk_done(count, ids, limit)
if upto and r[2] ~= '' then r[2] = string.format('%d', upto) end
return r
