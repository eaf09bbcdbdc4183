#!lua
--! needs extras
-- Schedules debounced tasks of one shard: one task per debounce key (the task's key).
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, then 8 per task: key, plugin, owner, max_attempts, marks (the trace
-- context and start_by marks of the last field, or ''), payload, quiet_ms, max_wait_ms.
-- A task of the key waiting for its first attempt takes the payload into its batch (the latest
-- is also its payload; past 1,000 only counted) and moves to now + quiet_ms, never past its first
-- payload's time + its max_wait_ms. A task of the key that runs, or waits to be retried, keeps the
-- payload for the next window (scheduled when it ends: see `record_ended`). Else (none, done,
-- dead) a new task is due at now + quiet_ms with this payload (after those a dead window kept).
-- Returns one string, a letter per task: o (new) m (merged, moved) q (kept for the next window).
local channel, shard = ARGV[1], ARGV[2]
local now = now_ms()
local out, earliest = {}, nil
local function count_of(list, letter, more)
  local n = 0
  for _, e in ipairs(list) do if string.sub(e, 1, 1) == letter then n = n + 1 end end
  return n + (tonumber(entry(list, more)) or 0)
end
local function bump(list, letter)
  for i, e in ipairs(list) do
    if string.sub(e, 1, 1) == letter then
      list[i] = letter .. string.format('%d', tonumber(string.sub(e, 2)) + 1)
      return
    end
  end
  list[#list + 1] = letter .. '1'
end
for a = 3, #ARGV - 7, 8 do
  local id, plugin, owner, max = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local marks, payload = ARGV[a + 4], ARGV[a + 5]
  local quiet, max_wait = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
  local t = parse(redis.call('HGET', K_TASKS, id))
  local head, ex, _ = '', nil, nil
  if t then head, ex, _ = split_last(t.payload) end
  local list = entries_of(ex)
  local q = entry(list, 'q')
  if t and q and t.st == 's' and t.att == 0 then
    local first = tonumber(string.match(q, '\30(%d+)$'))
    local qq, mw = string.match(q, '^(%d+)\30(%d+)')
    if count_of(list, 'b', 'm') < BATCH_MAX then list[#list + 1] = 'b' .. payload else bump(list, 'm') end
    unindex_scheduled(id, t)
    t.due = math.max(math.min(now + tonumber(qq), first + tonumber(mw)), 0)
    t.payload = join_last(head, list, payload)
    redis.call('HSET', K_TASKS, id, encode(t))
    index_scheduled(id, t)
    if not earliest or t.due < earliest then earliest = t.due end
    out[#out + 1] = 'm'
  elseif t and q and (t.st == 'r' or t.st == 's') then
    if not entry(list, 'p') then list[#list + 1] = 'p' .. string.format('%d', now) end
    if count_of(list, 'n', 'M') < BATCH_MAX then list[#list + 1] = 'n' .. payload else bump(list, 'M') end
    t.payload = join_last(head, list, _)
    redis.call('HSET', K_TASKS, id, encode(t))
    out[#out + 1] = 'q'
  else
    if t and t.st == 'r' then
      out[#out + 1] = 'r'
    else
      -- payloads a dead window kept for its next one come first
      local first, window = now, {}
      if t then
        for _, e in ipairs(list) do
          if string.sub(e, 1, 1) == 'n' then window[#window + 1] = 'b' .. string.sub(e, 2) end
        end
        if #window > 0 then first = tonumber(entry(list, 'p')) or now end
        if t.st == 's' then unindex_scheduled(id, t); record_ended(id, t, now, false)
        elseif t.st == 'x' then unindex_dead(id, t) end
        redis.call('HDEL', K_LOGS, id)
        redis.call('HDEL', K_RERUN, id)
      end
      window[#window + 1] = 'b' .. payload
      table.insert(window, 1, 'q' .. string.format('%d', quiet) .. '\30' .. string.format('%d', max_wait)
        .. '\30' .. string.format('%d', first))
      local nt = { st = 's', due = math.min(now + quiet, first + max_wait), att = 0, max = tonumber(max),
        created = string.format('%d', now), fin = '', plugin = plugin, owner = owner, err = '',
        payload = join_last(marks, window, payload) }
      redis.call('HSET', K_TASKS, id, encode(nt))
      index_scheduled(id, nt)
      if not earliest or nt.due < earliest then earliest = nt.due end
      out[#out + 1] = 'o'
    end
  end
end
if earliest then wake_if_head(channel, shard, earliest) end
return table.concat(out)
