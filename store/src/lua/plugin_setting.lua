#!lua flags=allow-oom
-- Changes one setting of a plugin, atomically (two changes of different settings never undo each
-- other), and announces it. Pausing and resuming also count the plugin's pause epoch: the shards
-- apply a pause or resume only if no later one was asked for (`pause.lua`).
-- KEYS[1]: plugin:settings (HASH name -> settings JSON); KEYS[2]: plugin:pause-epoch (HASH name
-- -> the number of pauses and resumes asked for).
-- ARGV: name, field ('paused' | 'max_concurrency'), value (JSON: true, false, a number, null),
-- channel.
-- Returns the plugin's pause epoch (after this change).
-- Bound: one plugin's settings (a few KiB).
local name, field, value, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HGET', KEYS[1], name)
local s = {}
if cur then s = cjson.decode(cur) end
s[field] = cjson.decode(value)
redis.call('HSET', KEYS[1], name, cjson.encode(s))
local epoch
if field == 'paused' then
  epoch = redis.call('HINCRBY', KEYS[2], name, 1)
else
  epoch = tonumber(redis.call('HGET', KEYS[2], name)) or 0
end
redis.call('PUBLISH', channel, name)
return epoch
