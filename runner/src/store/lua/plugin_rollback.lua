#!lua flags=allow-oom
-- Makes the version before the current one current again; announces it.
-- KEYS: plugins, history. ARGV: name, channel (then two key prefixes it does not need).
-- Returns the entry (JSON) now current, or 'missing' / 'no_previous'.
local name, channel = ARGV[1], ARGV[2]
local cur = redis.call('HGET', KEYS[1], name)
if not cur then return 'missing' end
local v = cjson.decode(cur).version
for _, e in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if cjson.decode(e).version < v then
    redis.call('HSET', KEYS[1], name, e)
    redis.call('PUBLISH', channel, name)
    return e
  end
end
return 'no_previous'
