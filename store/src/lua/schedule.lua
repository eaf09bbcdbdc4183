#!lua
--! needs indexes extras far
-- Schedules a batch of tasks of one shard.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, mode ('upsert' replaces a task that has not started; 'absent' only creates),
--       far horizon (ms; 0 = no far tier: else a plain task due that long from now or later goes
--       into the far tier, see `far`), then runs of tasks that share their settings: count, max_attempts, plugin, created (0 =
--       Redis time), unique_for_ms (0 = none: else scheduling the id again within that long after
--       the task finished is refused as 'duplicate'), then 4 per task: id, due, owner, payload.
--       (Every argument costs Redis ~0.2 µs to parse and turn into a Lua string: what tasks of
--       a batch share is sent once per run, not once per task.)
-- In 'upsert' mode the batch is all or nothing: if any of its ids is running or inside its dedup
-- window, nothing is written and the others answer 'not_written'.
-- Returns one string, a letter per task in the order given: o(k) r(unning) d(uplicate) e(xists)
-- n(ot_written). (One reply value, not one per task: each costs Redis ~0.3 µs.) When tasks written
-- listen for events (`o` entries in their extras, see `extras`), they get a stamp and their L
-- messages go into the outbox, and the reply is {letters, L message...}; a listening task
-- replaced lets its listeners go (U messages).
-- An id is a task's key, `<plugin>\x1f<id>`. In a shard that holds data of eggtimer 0.1.0 (meta
-- `legacy`), a record stored under the bare id by that release is the same task when its plugin
-- is the same: it is replaced (or, running, refuses the batch) as a record under the key is.
-- Bound: at most `SCHEDULE_CALL_TASKS` tasks and about `SCHEDULE_CALL_BYTES` of payloads per call
--  (the caller cuts a request so), each O(log n) in the indexes.
local channel, shard, mode = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local far_from, far_slot = tonumber(ARGV[4]), nil
if far_from > 0 then far_slot = far_slot_ms(far_from); far_from = now + far_from end
local now_s = string.format('%d', now)
local out = {}
local earliest = nil
local uniques = redis.call('EXISTS', K_UNIQUE) == 1
-- the ids, and for each the ARGV index of its own fields and of its run's; per run, its
-- unique_for_ms as a number (turned into one once per run, not per task)
local ids, at, run_of, unique_for_of = {}, {}, {}, {}
local a = 5
while a <= #ARGV do
  local count = tonumber(ARGV[a])
  unique_for_of[a] = tonumber(ARGV[a + 4])
  for j = 0, count - 1 do
    local i = #ids + 1
    at[i] = a + 5 + j * 4
    run_of[i] = a
    ids[i] = ARGV[at[i]]
  end
  a = a + 5 + count * 4
end
local n = #ids
-- a task of these keys in the far tier comes back first: what follows sees it as live
if far_in_use() then
  for _, id in ipairs(ids) do far_fetch(id) end
end
local recs = records_of(ids)
-- index -> {bare id, its parsed 0.1.0 record} where one of the same plugin is there
local legacy = {}
if redis.call('HEXISTS', K_META, 'legacy') == 1 then
  far_from = 0
  for i, key in ipairs(ids) do
    local mark = string.find(key, '\31', 1, true)
    if mark and not recs[i] then
      local bare = string.sub(key, mark + 1)
      local t = parse(redis.call('HGET', K_TASKS, bare))
      if t and t.plugin == string.sub(key, 1, mark - 1) then legacy[i] = { bare, t } end
    end
  end
end
if mode == 'upsert' then
  local refused = false
  for i, id in ipairs(ids) do
    local old = recs[i]
    out[i] = 'n'
    if (old and string.sub(old, 1, 1) == 'r') or (legacy[i] and legacy[i][2].st == 'r') then
      out[i] = 'r'
      refused = true
    elseif uniques and (in_unique_window(id, now) or (legacy[i] and in_unique_window(legacy[i][1], now))) then
      out[i] = 'd'
      refused = true
    end
  end
  if refused then return table.concat(out) end
  out = {}
end
-- A listening task's L messages, gathered; the last field returned carries its stamp.
local listens = {}
local function listen_from(id, last, now)
  local head, ex, rest = split_last(last)
  local list = entries_of(ex)
  local ls = listeners(list)
  if #ls == 0 then return last end
  local stamp = string.format('%d', redis.call('HINCRBY', K_META, 'listen', 1))
  local since = string.format('%d', now - (tonumber(entry(list, 'l')) or 60000))
  for _, l in ipairs(ls) do
    listens[#listens + 1] = 'L' .. l[1] .. '\30' .. id .. '\30' .. stamp .. '\30' .. l[2] .. '\30' .. l[3] .. '\30' .. since
  end
  table.insert(list, 1, 's' .. stamp)
  return join_last(head, list, rest)
end
-- The writes are gathered and made with one variadic call per key; an id named again in the
-- batch first flushes them, so it sees the record written for it before.
local pending, records, dues, parked, byowner, counts, firsts = {}, {}, {}, {}, {}, {}, {}
-- owned: plugin \0 owner -> records added less records ended (`count_owned`)
local bytes, heads, owned, prios = {}, {}, {}, {}
local function flush()
  far_flush()
  call_many('HSET', K_TASKS, records)
  due_add(dues)
  prio_add(prios)
  call_many('ZADD', K_PARKED, parked)
  call_many('ZADD', K_BYOWNER, byowner)
  local lows = {}
  for who, due in pairs(heads) do push(lows, string.format('%d', due), who) end
  lower_owner_heads(lows)
  for plugin, k in pairs(counts) do count_scheduled(plugin, k, firsts[plugin]) end
  for plugin, k in pairs(bytes) do charge(plugin, k) end
  for who, k in pairs(owned) do if k ~= 0 then count_owned(who, k) end end
  pending, records, dues, parked, byowner, counts, firsts = {}, {}, {}, {}, {}, {}, {}
  bytes, heads, owned, prios = {}, {}, {}, {}
end
for i = 1, n do
  local b, h = at[i], run_of[i]
  local id = ids[i]
  local old
  if pending[id] then
    flush()
    far_fetch(id)
    old = parse(redis.call('HGET', K_TASKS, id))
  else
    old = parse(recs[i])
  end
  local verdict = 'o'
  local was = legacy[i]
  if was and not old then
    local bare, t = was[1], was[2]
    if t.st == 'r' then verdict = 'r'
    elseif mode == 'absent' then verdict = 'e'
    else
      if t.st == 's' then unindex_scheduled(bare, t) elseif t.st == 'x' then unindex_dead(bare, t) end
      redis.call('HDEL', K_TASKS, bare)
      count_owned_record(t, -1)
      charge(t.plugin, -weight(t.payload))
      redis.call('HDEL', K_LOGS, bare)
      redis.call('HDEL', K_RERUN, bare)
      redis.call('ZREM', K_UNIQUE, bare)
    end
  end
  if verdict ~= 'o' then
  elseif old then
    if old.st == 'r' then verdict = 'r'
    elseif mode == 'absent' then verdict = 'e'
    elseif old.st == 's' then unindex_scheduled(id, old); record_ended(id, old, now, false)
    elseif old.st == 'x' then unindex_dead(id, old) end
  end
  if verdict == 'o' and mode == 'absent' and uniques and in_unique_window(id, now) then
    verdict = 'e'
  end
  if verdict == 'o' then
    -- a new occurrence: the log (and a debounced one's payloads) of the one it replaces go
    if old then
      charge(old.plugin, -weight(old.payload))
      if old.owner ~= '' and old.st ~= 'd' then
        local who = old.plugin .. '\0' .. old.owner
        owned[who] = (owned[who] or 0) - 1
      end
      redis.call('HDEL', K_LOGS, id)
      if string.find(old.payload, '\28', 1, true) then redis.call('UNLINK', window_key(id), next_key(id)) end
    end
    local created = ARGV[h + 3]
    if created == '0' then created = now_s end
    -- the record `encode` would write, built in one concatenation (the client sends due and
    -- max_attempts as plain integers)
    local due_s, plugin, owner, last = ARGV[b + 1], ARGV[h + 2], ARGV[b + 2], ARGV[b + 3]
    local due = tonumber(due_s)
    pending[id] = true
    local mark = string.byte(last, 1)
    local p = 0
    if mark == 28 or mark == 29 or mark == 30 then
      last = listen_from(id, last, now)
      p = priority_of(last)
    end
    local unique_for = unique_for_of[h]
    if unique_for == 0 and far_eligible(due, owner, last, far_from)
      and far_add(id, due, ARGV[h + 1], created, last, far_slot) then
      -- in the far tier (see `far`), counted and charged below as a live task is; the
      -- record of the task it replaces goes
      if old then redis.call('HDEL', K_TASKS, id) end
    else
      push(records, id, 's\t' .. due_s .. '\t0\t' .. ARGV[h + 1] .. '\t' .. created .. '\t\t' .. plugin
        .. '\t' .. owner .. '\t\t' .. last)
      -- the indexes of index_scheduled, gathered
      if is_held(plugin, owner) then
        push(parked, due_s, id)
      else
        push(dues, due_s, id)
        prio_push(prios, p, due, id)
        if owner ~= '' then
          local who = plugin .. '\0' .. owner
          if not heads[who] or due < heads[who] then heads[who] = due end
        end
      end
      if owner ~= '' then
        push(byowner, 0, owner_member(owner, due, id))
        local who = plugin .. '\0' .. owner
        owned[who] = (owned[who] or 0) + 1
      end
      if not earliest or due < earliest then earliest = due end
    end
    counts[plugin] = (counts[plugin] or 0) + 1
    bytes[plugin] = (bytes[plugin] or 0) + weight(last)
    if not firsts[plugin] or due < firsts[plugin] then firsts[plugin] = due end
    if unique_for > 0 then
      redis.call('ZADD', K_UNIQUE, -unique_for, id)
    elseif uniques then
      redis.call('ZREM', K_UNIQUE, id)
    end
  end
  out[#out + 1] = verdict
end
flush()
if earliest then wake_if_head(channel, shard, earliest) end
if #listens == 0 then return table.concat(out) end
outbox_add(now, listens)
local reply = { table.concat(out) }
for _, m in ipairs(listens) do reply[#reply + 1] = m end
return reply
