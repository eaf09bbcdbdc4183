-- Stores an uploaded plugin version and makes it current; announces it.
-- KEYS: plugins (HASH name -> current JSON), history (LIST, newest first), blob, seq (HASH).
-- ARGV: name, digest, size, uploaded_at, bytes, channel.
-- Returns {version, created (1) or 0 when these bytes are already the current version}.
local name, digest, size, at, bytes, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local cur = redis.call('HGET', KEYS[1], name)
if cur then
  local v = cjson.decode(cur)
  if v.digest == digest then return { v.version, 0 } end
end
local version = redis.call('HINCRBY', KEYS[4], name, 1)
redis.call('SET', KEYS[3], bytes)
local entry = cjson.encode({ name = name, version = version, digest = digest, size = tonumber(size),
  uploaded_at = tonumber(at) })
redis.call('LPUSH', KEYS[2], entry)
redis.call('HSET', KEYS[1], name, entry)
redis.call('PUBLISH', channel, name)
return { version, 1 }
