#!lua flags=allow-oom
--! needs extras
-- Hands events to the tasks of this shard that listen for them: D messages.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, then D messages (see `extras`).
-- A message acts only on the occurrence it names (its stamp), while it is scheduled and no event
-- has reached it yet, so a message delivered again does nothing: `c` cancels the task (deleted,
-- as DELETE does); `r` makes it due now with the event kept in its record (`task.event`). Either
-- lets its other listeners go (U messages into the outbox; the one that fired left `listeners`
-- with its event).
-- Returns {'<n acted>', U message...}.
-- Bound: the D messages of the call (one delivery's), each one task's record and its listeners (at
--  most 8).
local channel, shard = ARGV[1], ARGV[2]
local now = now_ms()
local acted, msgs, earliest = 0, {}, nil
local parsed, ids = {}, {}
for i = 3, #ARGV do
  -- (the event by its position, then one copy: a `(.*)` capture walks it a character at a time)
  local th, id, stamp, topic, key, at = string.match(ARGV[i],
    '^D(.)\30([^\30]*)\30([^\30]*)\30([^\30]*)\30([^\30]*)\30()')
  if th then
    local ev = string.sub(ARGV[i], at)
    parsed[#parsed + 1] = { th, id, stamp, topic, key, ev }
    ids[#ids + 1] = id
  end
end
local recs = records_of(ids)
-- a task that two messages name acts on the first (it listens no more after it)
local done = {}
for n, m in ipairs(parsed) do
  local th, id, stamp, topic, key, ev = m[1], m[2], m[3], m[4], m[5], m[6]
  local t = not done[id] and parse(recs[n])
  if t and t.st == 's' then
    local head, ex, payload = split_last(t.payload)
    local list = entries_of(ex)
    local listening = entry(list, 's') == stamp and not entry(list, 'e')
    if listening then
      listening = false
      for _, l in ipairs(listeners(list)) do
        if l[2] == topic and l[3] == key then listening = true end
      end
    end
    if listening then
      acted = acted + 1
      done[id] = true
      unlisten_msgs(id, list, msgs, topic .. '\31' .. key)
      unindex_scheduled(id, t)
      if th == 'c' then
        redis.call('HDEL', K_TASKS, id)
        count_owned_record(t, -1)
        charge(t.plugin, -weight(t.payload))
        redis.call('HDEL', K_LOGS, id)
        redis.call('HDEL', K_RERUN, id)
        redis.call('ZREM', K_UNIQUE, id)
        if entry(list, 'w') or entry(list, 'N') then redis.call('UNLINK', window_key(id), next_key(id)) end
      else
        list[#list + 1] = 'e' .. ev
        local was = weight(t.payload)
        t.payload = join_last(head, list, payload)
        charge(t.plugin, weight(t.payload) - was)
        t.due = math.min(t.due, now)
        redis.call('HSET', K_TASKS, id, encode(t))
        index_scheduled(id, t)
        if not earliest or t.due < earliest then earliest = t.due end
      end
    end
  end
end
outbox_add(now, msgs)
if earliest then wake_if_head(channel, shard, earliest) end
local out = { string.format('%d', acted) }
for _, m in ipairs(msgs) do out[#out + 1] = m end
return out
