--! part extras
--! needs shard record indexes buckets
-- What a task carries beyond its payload: the events it listens for and the one that reached
-- it, and a debounced task's payloads. They are kept in the record's last field, after the trace
-- context and start_by marks and before the payload: \28<entries>\28 (a JSON text holds no
-- control character, and the API refuses them in topics and keys), entries separated by \31,
-- each a letter and its value:
--   s<stamp>        the listening occurrence (the shard's `listen` counter when it was scheduled)
--   o<c|r><topic>\30<key>   listens: cancel, or run now, when an event of topic and key arrives
--   l<ms>           how long before the task was scheduled an event still matches
--   e<event JSON>   the event that made it run (it listens no more)
--   q<quiet>\30<max_wait>\30<first>   debounced: its window's parameters, first payload's time
--   w<count>\30<bytes>   the window's payloads, held in the list `window_key(id)` (the latest is
--                   also the task's payload); m<n>: how many more came than the window keeps
--                   (WINDOW_MAX payloads, WINDOW_BYTES bytes)
--   N<count>\30<bytes>, M<n>, p<first>   payloads that came while it ran, for the next window,
--                   held in the list `next_key(id)`
--   P<digit>        its priority, 1-9 (see `priority`; 0 is not stored)
--   b<payload>, n<payload>   (0.2.0) payloads held in the record itself; the first script that
--                   adds to such a window moves them into the lists (`lift`)
-- A debounced task's payloads live in lists beside its record, not in it, so that adding one
-- costs what that payload costs (RPUSH, and the record rewritten with only the latest payload),
-- whatever the window already holds. The lists go with the record: `forget` deletes both, a
-- done task keeps its window's list until its record is forgotten (`forget_done`), a dead one
-- keeps both for a retry.
--
-- Events and listeners live in the shard of their topic and key (the event shard), tasks in
-- theirs: a change on one shard that concerns the other is written to the first one's `outbox`
-- (ZSET message -> time written) in the same script, and delivered from there (at once by the
-- caller; after a second by the outbox sweeper, when the caller died). Each message's effect is
-- idempotent, so a message delivered twice acts once. Messages, fields separated by \30:
--   L<c|r> task stamp topic key since   task shard -> event shard: listen (an event stored at or
--                                        after `since` matches at once)
--   D<c|r> task stamp topic key event    event shard -> task shard: an event reached a listener
--   U topic key task stamp               task shard -> event shard: the task listens no more
--
-- The listeners of one topic and key (a `listeners` field) are kept in the field itself while
-- there are at most LISTEN_INLINE of them (\29-separated `then \30 task \30 stamp`); past that,
-- all of them move to a hash of their own, `spill_key(field)` (`task \30 stamp` -> then), where
-- one joins or leaves in O(1) whatever the number listening. (0.2.0 kept any number in the
-- field: the first script that adds to or takes from such a field moves them, once.) An event
-- for more listeners than one call hands over (EVENT_LISTENERS_PER_CALL) takes them aside into
-- `drain_key(event id)`, and a P message in `drains_key()` (message -> time) says so:
--   P topic key event-id event           event shard: hand the event to the drain's listeners
-- `drain.lua` hands it to the next EVENT_LISTENERS_PER_CALL of them per call (into the outbox,
-- as D messages), and strikes the P message when none is left; the outbox sweeper takes over
-- the drains of a caller that died.

-- What a debounced task's window (and its next one) holds at most: payloads past either bound
-- are only counted.
local WINDOW_MAX = 1000
local WINDOW_BYTES = 1048576

local LISTEN_INLINE = 8
local EVENT_LISTENERS_PER_CALL = 500
local function spill_key(field) return K_LISTENERS .. ':' .. field end
local function drain_key(event_id) return K_LISTENERS .. ':d:' .. event_id end
local function drains_key() return K_LISTENERS .. ':drains' end

-- How many listeners an inline list holds.
local function inline_count(ls)
  local _, n = string.gsub(ls, '\29', '')
  return n + 1
end

-- Adds the listeners of an inline list to the hash `key` (`task \30 stamp` -> then).
local function inline_into(key, ls)
  local pairs_ = {}
  for l in string.gmatch(ls, '[^\29]+') do push(pairs_, string.sub(l, 3), string.sub(l, 1, 1)) end
  call_many('HSET', key, pairs_)
end

-- Moves a field's inline listeners (any number) into its own hash.
local function spill(field, ls)
  inline_into(spill_key(field), ls)
  redis.call('HDEL', K_LISTENERS, field)
end

-- A record's last field as (marks before the extras, the extras or nil, the payload).
local function split_last(last)
  local b = string.byte(last, 1)
  if b ~= 28 and b ~= 29 and b ~= 30 then return '', nil, last end
  local head = ''
  local m = string.match(last, '^\30[^\30]*\30')
  if m then head = m; last = string.sub(last, #m + 1) end
  m = string.match(last, '^\29[^\29]*\29')
  if m then head = head .. m; last = string.sub(last, #m + 1) end
  local ex = string.match(last, '^\28([^\28]*)\28')
  if ex then last = string.sub(last, #ex + 3) end
  return head, ex, last
end

-- The entries of extras (a list of strings).
local function entries_of(ex)
  local out = {}
  if ex then
    for e in string.gmatch(ex, '[^\31]+') do out[#out + 1] = e end
  end
  return out
end

local function join_last(head, list, payload)
  if #list == 0 then return head .. payload end
  return head .. '\28' .. table.concat(list, '\31') .. '\28' .. payload
end

-- The first entry of `list` with this letter (its value), or nil.
local function entry(list, letter)
  for _, e in ipairs(list) do
    if string.sub(e, 1, 1) == letter then return string.sub(e, 2) end
  end
  return nil
end

-- Sets the entry of this letter to `value` (added at the end if there is none).
local function set_entry(list, letter, value)
  for i, e in ipairs(list) do
    if string.sub(e, 1, 1) == letter then list[i] = letter .. value; return end
  end
  list[#list + 1] = letter .. value
end

-- How many payloads (and bytes) the list of a `w` or `N` entry holds.
local function held(list, letter)
  local v = entry(list, letter)
  if not v then return 0, 0 end
  local c, z = string.match(v, '^(%d+)\30(%d+)$')
  return tonumber(c) or 0, tonumber(z) or 0
end

-- Adds a payload to the window (`letter` 'w') or the next one ('N') when it has room, else
-- counts it in `more` ('m' or 'M'). One RPUSH, whatever the window holds.
local function hold(id, list, letter, more, payload)
  local c, z = held(list, letter)
  if c < WINDOW_MAX and z + #payload <= WINDOW_BYTES then
    redis.call('RPUSH', letter == 'w' and window_key(id) or next_key(id), payload)
    set_entry(list, letter, string.format('%d', c + 1) .. '\30' .. string.format('%d', z + #payload))
  else
    set_entry(list, more, string.format('%d', (tonumber(entry(list, more)) or 0) + 1))
  end
end

-- A record written by 0.2.0 holds its window's payloads itself (`b`, `n`): moves them into the
-- lists (once; bounded by what 0.2.0 let a window hold) and answers the entries without them.
local function lift(id, list)
  local out, b, n = {}, {}, {}
  for _, e in ipairs(list) do
    local l = string.sub(e, 1, 1)
    if l == 'b' then b[#b + 1] = string.sub(e, 2)
    elseif l == 'n' then n[#n + 1] = string.sub(e, 2)
    else out[#out + 1] = e end
  end
  if #b == 0 and #n == 0 then return list end
  for _, p in ipairs(b) do hold(id, out, 'w', 'm', p) end
  for _, p in ipairs(n) do hold(id, out, 'N', 'M', p) end
  return out
end

-- The listeners of `list`: {then, topic, key} each.
local function listeners(list)
  local out = {}
  for _, e in ipairs(list) do
    if string.sub(e, 1, 1) == 'o' then
      local topic, key = string.match(e, '^o.([^\30]*)\30(.*)$')
      out[#out + 1] = { string.sub(e, 2, 2), topic, key }
    end
  end
  return out
end

-- Writes messages into this shard's outbox.
local function outbox_add(now, msgs)
  if #msgs == 0 then return end
  local pairs_ = {}
  for _, m in ipairs(msgs) do push(pairs_, now, m) end
  call_many('ZADD', K_OUTBOX, pairs_)
end

-- The U messages of a task that listens no more (none if an event already reached it: its
-- listeners were let go then), appended to `msgs`; `fired` (topic \31 key), if given, is the
-- listener an event just took out of `listeners`, which needs none.
local function unlisten_msgs(id, list, msgs, fired)
  if entry(list, 'e') then return end
  local stamp = entry(list, 's') or ''
  for _, l in ipairs(listeners(list)) do
    if l[2] .. '\31' .. l[3] ~= fired then
      msgs[#msgs + 1] = 'U' .. l[2] .. '\30' .. l[3] .. '\30' .. id .. '\30' .. stamp
    end
  end
end

-- A task's record ends (done, dead, cancelled, replaced): its listeners are let go (U messages
-- into the outbox) and, when it ran and finished (`done`), payloads that came while it ran become
-- the next window's task, due `quiet` ms from now (never past their first + max_wait). `t` is
-- its record, parsed. (A dead one keeps them, and the next schedule of its key takes them into
-- its window: see `debounce.lua`.) The record and lists of a cancelled or replaced one go with
-- `forget`. Returns how many listeners it let go.
local function record_ended(id, t, now, done)
  local head, ex, payload = split_last(t.payload)
  if not ex then return 0 end
  local list = entries_of(ex)
  local msgs = {}
  unlisten_msgs(id, list, msgs)
  outbox_add(now, msgs)
  local q = entry(list, 'q')
  if not q or not done then return #msgs end
  if entry(list, 'n') then list = lift(id, list) end
  local count, bytes = held(list, 'N')
  if count == 0 or redis.call('EXISTS', next_key(id)) == 0 then return #msgs end
  local wk = window_key(id)
  redis.call('UNLINK', wk) -- the ended window's (freed in the background)
  redis.call('RENAME', next_key(id), wk)
  local quiet, max_wait = string.match(q, '^(%d+)\30(%d+)')
  local first = tonumber(entry(list, 'p')) or now
  local n = { 'q' .. quiet .. '\30' .. max_wait .. '\30' .. string.format('%d', first),
    'w' .. string.format('%d', count) .. '\30' .. string.format('%d', bytes) }
  local more = entry(list, 'M')
  if more then n[#n + 1] = 'm' .. more end
  local last = redis.call('LINDEX', wk, -1)
  local nt = { st = 's', due = math.min(now + tonumber(quiet), first + tonumber(max_wait)),
    att = 0, max = t.max, created = string.format('%d', now), fin = '', plugin = t.plugin,
    owner = t.owner, err = '', payload = join_last(head, n, last) }
  redis.call('HSET', K_TASKS, id, encode(nt))
  count_owned_record(nt, 1)
  charge(t.plugin, weight(nt.payload) - weight(t.payload))
  index_scheduled(id, nt)
  return #msgs
end

-- Deletes a scheduled, dead or done task (cancelled, replaced, dropped, its plugin deleted): its
-- indexes, its listeners (a scheduled one's; a dead or done one let them go when it ended), its
-- record, log, rerun note and window lists (a scheduled one never finished, so it leaves no
-- dedup window either; a done one's entry in `finished` finds no record and is passed over).
-- Every path that deletes a task goes through here, so none leaks what the task held, but the
-- trim of done records past their retention (`forget_done`, which drops their windows itself).
-- Returns how many listeners it let go.
local function forget(id, t, now)
  local let_go = 0
  if t.st == 's' then
    unindex_scheduled(id, t)
    let_go = record_ended(id, t, now, false)
    redis.call('ZREM', K_UNIQUE, id)
  elseif t.st == 'x' then
    unindex_dead(id, t)
  end
  redis.call('HDEL', K_TASKS, id)
  count_owned_record(t, -1)
  charge(t.plugin, -weight(t.payload))
  redis.call('HDEL', K_LOGS, id)
  redis.call('HDEL', K_RERUN, id)
  if string.find(t.payload, '\28', 1, true) then
    redis.call('UNLINK', window_key(id), next_key(id))
  end
  return let_go
end
