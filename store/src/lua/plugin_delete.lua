#!lua flags=allow-oom
--! needs blobs
-- Deletes a plugin (current version and history) and what is its: its settings, pause epoch,
-- secrets, concurrency slots, rate state and slot waiters; the keys named by a pattern (kv,
-- per-owner slots) are left to `plugin_purge.lua`, which the caller runs next: the name is put in
-- the purge set first, so a caller killed before it is done is followed by whoever uploads the
-- name again. Announces it. The bytes of its versions leave Redis unless a version of another
-- plugin has the same bytes.
-- KEYS: plugins, history, settings, pause epoch, secrets, slots, rate starts, slot waits, purge
-- set, rate queue, topics, the three keys of its kv index, its emitted streams' bytes.
-- ARGV: name, channel, history key prefix, blob key prefix.
-- Returns 1, or 0 when there was no such plugin.
-- Bound: one plugin's own keys (its history: at most `--keep-versions`), not its kv (purged in
--  chunks by `plugin_purge`).
local name, history_prefix, blob_prefix = ARGV[1], ARGV[3], ARGV[4]
if redis.call('HDEL', KEYS[1], name) == 0 then return 0 end
local dropped = {}
for _, e in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do dropped[cjson.decode(e).digest] = true end
redis.call('DEL', KEYS[2])
drop_unkept_blobs(dropped, KEYS[1], history_prefix, blob_prefix)
redis.call('HDEL', KEYS[3], name)
redis.call('HDEL', KEYS[4], name)
redis.call('DEL', KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[10], KEYS[11], KEYS[12], KEYS[13],
  KEYS[14], KEYS[15])
redis.call('SADD', KEYS[9], name)
redis.call('PUBLISH', ARGV[2], name)
return 1
