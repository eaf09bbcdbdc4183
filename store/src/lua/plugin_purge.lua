#!lua flags=allow-oom
-- Deletes one chunk of a deleted plugin's keys that only a pattern names (its kv, its per-owner
-- slots and slot waiters): SCAN from `cursor` over at most `count` keys of this node (all of them
-- share the namespace's hash tag, so they are on the node this script runs on), deleting those
-- that match one of the patterns. When the scan is done the name leaves the purge set.
-- KEYS: purge set (its hash tag routes the script). ARGV: name, cursor, count, patterns...
-- Returns {the next cursor ('0' when done), keys deleted}.
-- Bound: one SCAN of at most `count` keys per call, and deletes of those that match.
local name, cursor, count = ARGV[1], ARGV[2], ARGV[3]
local deleted = 0
local r = redis.call('SCAN', cursor, 'COUNT', count)
for _, key in ipairs(r[2]) do
  for i = 4, #ARGV do
    -- the patterns are literal prefixes: plugin names are [a-z0-9-]
    if string.sub(key, 1, #ARGV[i]) == ARGV[i] then
      redis.call('DEL', key)
      deleted = deleted + 1
      break
    end
  end
end
if r[1] == '0' then redis.call('SREM', KEYS[1], name) end
return {r[1], deleted}
