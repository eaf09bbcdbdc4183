#!lua
--! needs extras
-- Records events of this shard's topics and keys (this is their event shard), and hands each to
-- the tasks listening for it.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: shard, retention_ms (how long an event is kept for listeners scheduled after it), then
-- 3 per event: topic, key, data (JSON text). No events: only drops the expired ones.
-- Each event is stored as the latest of its topic and key (replacing the one before) until
-- retention_ms has passed; its listeners leave `listeners` and a D message for each goes into
-- the outbox (deleted by the caller once delivered). Up to 500 expired events are dropped per run.
-- Returns {events stored, of them those no task listened for, D message...}.
-- Bound: the events of one call (at most 1,000 per request, those of this shard), each one field
--  and its listeners, plus at most 500 expired events dropped. An event for a topic and key that
--  many tasks listen on writes a D message for each of them: bounded by the tasks listening, not
--  yet by the call.
local shard, retention = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local at = string.format('%d', now)
local count = math.floor((#ARGV - 2) / 3)
local msgs, unmatched = {}, 0
if count > 0 then
  -- (per event: one id, one stored entry, one look for listeners; written in variadic calls)
  local n0 = redis.call('HINCRBY', K_META, 'event', count) - count
  local fields, stored, times = {}, {}, {}
  for j = 1, count do
    local i = 3 + (j - 1) * 3
    local topic, key, data = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local field = topic .. '\31' .. key
    fields[j] = field
    local ev = '{"id":"' .. shard .. '-' .. string.format('%d', n0 + j) .. '","topic":' .. cjson.encode(topic)
      .. ',"key":' .. cjson.encode(key) .. ',"at":' .. at .. ',"data":' .. data .. '}'
    push(stored, field, at .. '\30' .. ev)
    push(times, now, field)
  end
  call_many('HSET', K_EVENTS, stored)
  call_many('ZADD', K_EVENT_TIMES, times)
  local ls = hmget(K_LISTENERS, fields)
  local taken, gone = {}, {}
  for j = 1, count do
    local l = ls[j]
    if not l or taken[fields[j]] then
      unmatched = unmatched + 1
    else
      taken[fields[j]] = true
      gone[#gone + 1] = fields[j]
      local i = 3 + (j - 1) * 3
      local topic, key = ARGV[i], ARGV[i + 1]
      local ev = string.sub(stored[2 * j], #at + 2)
      for one in string.gmatch(l, '[^\29]+') do
        local th, task, stamp = string.match(one, '^(.)\30([^\30]*)\30(.*)$')
        msgs[#msgs + 1] = 'D' .. th .. '\30' .. task .. '\30' .. stamp .. '\30' .. topic .. '\30' .. key .. '\30' .. ev
      end
    end
  end
  call_many('HDEL', K_LISTENERS, gone)
end
outbox_add(now, msgs)
local old = redis.call('ZRANGEBYSCORE', K_EVENT_TIMES, '-inf', '(' .. string.format('%d', now - retention),
  'LIMIT', '0', '500')
if #old > 0 then
  call_many('HDEL', K_EVENTS, old)
  call_many('ZREM', K_EVENT_TIMES, old)
end
local out = { count, unmatched }
for _, m in ipairs(msgs) do out[#out + 1] = m end
return out
