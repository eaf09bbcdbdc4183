#!lua
--! needs extras far
-- Schedules debounced tasks of one shard: one task per debounce key (the task's key).
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, then 8 per task: key, plugin, owner, max_attempts, marks (the trace
-- context and start_by marks of the last field, or ''), payload, quiet_ms, max_wait_ms.
-- A task of the key waiting for its first attempt takes the payload into its window (the latest
-- is also its payload; past WINDOW_MAX payloads or WINDOW_BYTES only counted) and moves to
-- now + quiet_ms, never past its first payload's time + its max_wait_ms. A task of the key that
-- runs, or waits to be retried, keeps the payload for the next window (scheduled when it ends:
-- see `record_ended`). Else (none, done, dead) a new task is due at now + quiet_ms with this
-- payload (after those a dead window kept).
-- Bound: per task, one HGET of a record that holds one payload and a few counters, one RPUSH of
-- the payload, one HSET: what the call brings, never what the window already holds (its
-- payloads are in a list beside the record, see `extras`). Replacing a done or dead window
-- deletes its list (UNLINK: freed in the background).
-- Returns one string, a letter per task: o (new) m (merged, moved) q (kept for the next window)
-- r (a task of that id runs and is not debounced).
-- Bound: at most `DEBOUNCE_CALL_TASKS` specs and about `DEBOUNCE_CALL_BYTES` of payloads per call
--  (the caller cuts a request so); each merge is one record of one payload, one RPUSH and an LTRIM,
--  whatever its window holds.
local channel, shard = ARGV[1], ARGV[2]
local now = now_ms()
local out, earliest = {}, nil
for a = 3, #ARGV - 7, 8 do
  local id, plugin, owner, max = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local marks, payload = ARGV[a + 4], ARGV[a + 5]
  local quiet, max_wait = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
  far_fetch(id)
  local t = parse(redis.call('HGET', K_TASKS, id))
  local head, ex, current = '', nil, nil
  -- what its record held, for the plugin's task bytes (`charge`)
  local was = 0
  if t then head, ex, current = split_last(t.payload); was = weight(t.payload) end
  local list = entries_of(ex)
  local q = entry(list, 'q')
  if t and q and t.st == 's' and t.att == 0 then
    list = lift(id, list)
    local first = tonumber(string.match(q, '\30(%d+)$'))
    local qq, mw = string.match(q, '^(%d+)\30(%d+)')
    hold(id, list, 'w', 'm', payload)
    unindex_scheduled(id, t)
    t.due = math.max(math.min(now + tonumber(qq), first + tonumber(mw)), 0)
    t.payload = join_last(head, list, payload)
    redis.call('HSET', K_TASKS, id, encode(t))
    charge(t.plugin, weight(t.payload) - was)
    index_scheduled(id, t)
    if not earliest or t.due < earliest then earliest = t.due end
    out[#out + 1] = 'm'
  elseif t and q and (t.st == 'r' or t.st == 's') then
    list = lift(id, list)
    if not entry(list, 'p') then list[#list + 1] = 'p' .. string.format('%d', now) end
    hold(id, list, 'N', 'M', payload)
    t.payload = join_last(head, list, current)
    redis.call('HSET', K_TASKS, id, encode(t))
    charge(t.plugin, weight(t.payload) - was)
    out[#out + 1] = 'q'
  elseif t and t.st == 'r' then
    out[#out + 1] = 'r'
  else
    -- payloads a dead window kept for its next one come first
    local first, window = now, {}
    if t then
      list = lift(id, list)
      local wk = window_key(id)
      redis.call('UNLINK', wk)
      local count, bytes = held(list, 'N')
      if count > 0 and redis.call('EXISTS', next_key(id)) == 1 then
        redis.call('RENAME', next_key(id), wk)
        window[1] = 'w' .. string.format('%d', count) .. '\30' .. string.format('%d', bytes)
        first = tonumber(entry(list, 'p')) or now
      end
      local more = entry(list, 'M')
      if more then window[#window + 1] = 'm' .. more end
      if t.st == 's' then unindex_scheduled(id, t); record_ended(id, t, now, false)
      elseif t.st == 'x' then unindex_dead(id, t) end
      redis.call('UNLINK', next_key(id))
      redis.call('HDEL', K_LOGS, id)
      redis.call('HDEL', K_RERUN, id)
      charge(t.plugin, -was)
      count_owned_record(t, -1)
    end
    hold(id, window, 'w', 'm', payload)
    table.insert(window, 1, 'q' .. string.format('%d', quiet) .. '\30' .. string.format('%d', max_wait)
      .. '\30' .. string.format('%d', first))
    local nt = { st = 's', due = math.min(now + quiet, first + max_wait), att = 0, max = tonumber(max),
      created = string.format('%d', now), fin = '', plugin = plugin, owner = owner, err = '',
      payload = join_last(marks, window, payload) }
    redis.call('HSET', K_TASKS, id, encode(nt))
    count_owned_record(nt, 1)
    charge(plugin, weight(nt.payload))
    index_scheduled(id, nt)
    if not earliest or nt.due < earliest then earliest = nt.due end
    out[#out + 1] = 'o'
  end
end
if earliest then wake_if_head(channel, shard, earliest) end
return table.concat(out)
