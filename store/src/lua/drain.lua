#!lua
--! needs extras
-- Hands an event to the next listeners of a drain (those `publish` took aside: more than one call
-- hands over): D messages into the outbox (deleted by the caller once delivered), as `publish`
-- writes them; the drain's P message leaves `drains_key()` with its last listener.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: a P message (see `extras`).
-- Returns {'1' when no listener is left, else '0', D message...}.
-- Bound: EVENT_LISTENERS_PER_CALL listeners of the drain.
local p = ARGV[1]
local topic, key, event_id, from = string.match(p, '^P([^\30]*)\30([^\30]*)\30([^\30]*)\30()')
if not topic then return { '1' } end
local ev = string.sub(p, from)
local dk = drain_key(event_id)
local got = redis.call('HRANDFIELD', dk, EVENT_LISTENERS_PER_CALL, 'WITHVALUES')
local msgs, fields = {}, {}
local suffix = '\30' .. topic .. '\30' .. key .. '\30' .. ev
for i = 1, #got, 2 do
  fields[#fields + 1] = got[i]
  msgs[#msgs + 1] = 'D' .. got[i + 1] .. '\30' .. got[i] .. suffix
end
call_many('HDEL', dk, fields)
local now = now_ms()
local done = redis.call('EXISTS', dk) == 0
if done then
  redis.call('ZREM', drains_key(), p)
else
  -- touched: the sweeper leaves a drain alone while its caller goes on with it
  redis.call('ZADD', drains_key(), 'XX', now, p)
end
outbox_add(now, msgs)
local out = { done and '1' or '0' }
for _, m in ipairs(msgs) do out[#out + 1] = m end
return out
