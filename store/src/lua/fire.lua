#!lua
--! needs indexes far
-- Creates one firing of a recurring schedule as an ordinary scheduled task, at most once.
-- KEYS: the shard's keys (the `shard` part), then KEYS[K_FIRST]: fired (ZSET firing id ->
-- created at: firings whose schedule has not yet recorded them; the scheduler removes an entry
-- once the schedule has moved past it, and entries older than ARGV[9] ms are trimmed).
-- ARGV: channel, shard, id (the firing's key, `<plugin>\x1f<schedule>@<due>`), due,
-- max_attempts, plugin, owner, payload, keep_fired_ms.
-- Returns 'ok' | 'exists' (created before: by another runner, or before a crash; in a shard of
-- eggtimer 0.1.0's data, under its bare id too).
-- Bound: one firing, and a trim of firing marks older than ARGV[9] (each firing writes one).
local channel, shard, id = ARGV[1], ARGV[2], ARGV[3]
local fired = KEYS[K_FIRST]
local now = now_ms()
local function made(key)
  far_fetch(key)
  return redis.call('ZSCORE', fired, key) or redis.call('HEXISTS', K_TASKS, key) == 1
end
if made(id) then return 'exists' end
if redis.call('HEXISTS', K_META, 'legacy') == 1 then
  local bare = string.sub(id, (string.find(id, '\31', 1, true) or 0) + 1)
  if made(bare) then return 'exists' end
end
local t = { st = 's', due = tonumber(ARGV[4]), att = 0, max = tonumber(ARGV[5]),
  created = string.format('%d', now), fin = '', plugin = ARGV[6], owner = ARGV[7], err = '',
  payload = ARGV[8] }
redis.call('HSET', K_TASKS, id, encode(t))
count_owned_record(t, 1)
charge(t.plugin, weight(t.payload))
index_scheduled(id, t)
redis.call('ZADD', fired, now, id)
redis.call('ZREMRANGEBYSCORE', fired, '-inf', now - tonumber(ARGV[9]))
wake_if_head(channel, shard, t.due)
return 'ok'
