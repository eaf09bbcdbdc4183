#!lua flags=allow-oom
-- Makes a version in a plugin's history current (a candidate promoted, or a rollback), if the
-- current version is still the one the caller checked against; announces it. The current entry
-- records the version it replaced (`previous`: what a rollback makes current again).
-- KEYS: plugins (HASH name -> current JSON), history (LIST, newest first).
-- ARGV: name, version, channel, expected current version ('' for any).
-- Returns the entry (JSON) now current, or 'missing' (no such plugin or version in its history)
-- or 'moved' (the current version is no longer the expected one).
-- Bound: one plugin's history (at most `--keep-versions` entries).
local name, version, channel, expected = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local cur = redis.call('HGET', KEYS[1], name)
if not cur then return 'missing' end
local previous = cjson.decode(cur).version
if expected ~= '' and previous ~= tonumber(expected) then return 'moved' end
local history = redis.call('LRANGE', KEYS[2], 0, -1)
for i, e in ipairs(history) do
  local v = cjson.decode(e)
  if v.version == version then
    if v.candidate then
      v.candidate = nil
      e = cjson.encode(v)
      redis.call('LSET', KEYS[2], i - 1, e)
    end
    v.previous = previous
    e = cjson.encode(v)
    redis.call('HSET', KEYS[1], name, e)
    redis.call('PUBLISH', channel, name)
    return e
  end
end
return 'missing'
