#!lua flags=allow-oom
--! needs blobs
-- Deletes a plugin (current version and history); announces it. The bytes of its versions
-- leave Redis unless a version of another plugin has the same bytes.
-- KEYS: plugins, history. ARGV: name, channel, history key prefix, blob key prefix.
-- Returns 1, or 0 when there was no such plugin.
local history_prefix, blob_prefix = ARGV[3], ARGV[4]
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
local dropped = {}
for _, e in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do dropped[cjson.decode(e).digest] = true end
redis.call('DEL', KEYS[2])
drop_unkept_blobs(dropped, KEYS[1], history_prefix, blob_prefix)
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
