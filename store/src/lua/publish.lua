#!lua
--! needs extras
-- Records events of this shard's topics and keys (this is their event shard), and hands each to
-- the tasks listening for it.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: shard, retention_ms (how long an event is kept for listeners scheduled after it), then
-- 3 per event: topic, key, data (JSON text). No events: only drops the expired ones.
-- Each event is stored as the latest of its topic and key (replacing the one before) until
-- retention_ms has passed; its listeners leave `listeners` and a D message for each goes into
-- the outbox (deleted by the caller once delivered); the listeners past the first
-- EVENT_LISTENERS_PER_CALL of the call are taken aside for `drain.lua` instead (a P message each
-- event, see `extras`). Up to 500 expired events are dropped per run.
-- Returns {events stored, of them those no task listened for, D or P message...}.
-- Bound: the events of one call (at most 250 and about 128 KiB of them, `PUBLISH_CALL_*` in
--  store/src/events.rs), each one field,
--  at most EVENT_LISTENERS_PER_CALL D messages in all (a drain's listeners are moved aside with one
--  RENAME), plus at most 500 expired events dropped.
local shard, retention = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local at = string.format('%d', now)
local count = math.floor((#ARGV - 2) / 3)
local msgs, drains, unmatched = {}, {}, 0
if count > 0 then
  -- (per event: one id, one stored entry, one look for listeners; written in variadic calls)
  local n0 = redis.call('HINCRBY', K_META, 'event', count) - count
  local fields, stored, times, ids = {}, {}, {}, {}
  for j = 1, count do
    local i = 3 + (j - 1) * 3
    local topic, key, data = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local field = topic .. '\31' .. key
    fields[j] = field
    ids[j] = shard .. '-' .. string.format('%d', n0 + j)
    local ev = '{"id":"' .. ids[j] .. '","topic":' .. cjson.encode(topic)
      .. ',"key":' .. cjson.encode(key) .. ',"at":' .. at .. ',"data":' .. data .. '}'
    push(stored, field, at .. '\30' .. ev)
    push(times, now, field)
  end
  call_many('HSET', K_EVENTS, stored)
  call_many('ZADD', K_EVENT_TIMES, times)
  local ls = hmget(K_LISTENERS, fields)
  local taken, gone = {}, {}
  local room = EVENT_LISTENERS_PER_CALL
  for j = 1, count do
    local l, sk = ls[j], spill_key(fields[j])
    local spilled = taken[fields[j]] and 0 or redis.call('HLEN', sk)
    if taken[fields[j]] or (not l and spilled == 0) then
      unmatched = unmatched + 1
    else
      taken[fields[j]] = true
      gone[#gone + 1] = fields[j]
      local i = 3 + (j - 1) * 3
      local topic, key = ARGV[i], ARGV[i + 1]
      local ev = string.sub(stored[2 * j], #at + 2)
      local n = spilled + (l and inline_count(l) or 0)
      if n <= room then
        room = room - n
        local prefix = '\30' .. topic .. '\30' .. key .. '\30' .. ev
        if l then
          for one in string.gmatch(l, '[^\29]+') do
            msgs[#msgs + 1] = 'D' .. one .. prefix
          end
        end
        if spilled > 0 then
          local all = redis.call('HGETALL', sk)
          for k = 1, #all, 2 do msgs[#msgs + 1] = 'D' .. all[k + 1] .. '\30' .. all[k] .. prefix end
          redis.call('UNLINK', sk)
        end
      else
        -- too many for this call: they go aside, to be handed the event in calls of their own
        local dk = drain_key(ids[j])
        if spilled > 0 then redis.call('RENAME', sk, dk) end
        if l then inline_into(dk, l) end
        local p = 'P' .. topic .. '\30' .. key .. '\30' .. ids[j] .. '\30' .. ev
        redis.call('ZADD', drains_key(), now, p)
        drains[#drains + 1] = p
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
for _, p in ipairs(drains) do out[#out + 1] = p end
return out
