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
local shard, retention = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local at = string.format('%d', now)
local msgs, stored, unmatched = {}, 0, 0
for i = 3, #ARGV - 2, 3 do
  local topic, key, data = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local field = topic .. '\31' .. key
  local n = redis.call('HINCRBY', K_META, 'event', 1)
  local ev = '{"id":"' .. shard .. '-' .. string.format('%d', n) .. '","topic":' .. cjson.encode(topic)
    .. ',"key":' .. cjson.encode(key) .. ',"at":' .. at .. ',"data":' .. data .. '}'
  redis.call('HSET', K_EVENTS, field, at .. '\30' .. ev)
  redis.call('ZADD', K_EVENT_TIMES, now, field)
  stored = stored + 1
  local ls = redis.call('HGET', K_LISTENERS, field)
  if not ls then unmatched = unmatched + 1 end
  if ls then
    redis.call('HDEL', K_LISTENERS, field)
    for l in string.gmatch(ls, '[^\29]+') do
      local th, task, stamp = string.match(l, '^(.)\30([^\30]*)\30(.*)$')
      msgs[#msgs + 1] = 'D' .. th .. '\30' .. task .. '\30' .. stamp .. '\30' .. topic .. '\30' .. key .. '\30' .. ev
    end
  end
end
outbox_add(now, msgs)
local old = redis.call('ZRANGEBYSCORE', K_EVENT_TIMES, '-inf', '(' .. string.format('%d', now - retention),
  'LIMIT', '0', '500')
if #old > 0 then
  call_many('HDEL', K_EVENTS, old)
  call_many('ZREM', K_EVENT_TIMES, old)
end
local out = { stored, unmatched }
for _, m in ipairs(msgs) do out[#out + 1] = m end
return out
