-- Deletes a plugin (current version and history); announces it. Blobs stay (content-addressed).
-- KEYS: plugins, history. ARGV: name, channel. Returns 1, or 0 when there was no such plugin.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
