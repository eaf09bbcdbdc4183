#!lua flags=allow-oom
-- A shard lease: which runner polls the shard (not a claim's lease).
-- KEYS[1]: the shard's lease key. ARGV: op, runner id, ttl ms. Returns, per op:
--   'acquire' -> 1 when this runner holds it now (taken, or already its own and renewed)
--   'renew'   -> 1 when this runner still holds it (and it is extended), 0 when lost
--   'release' -> 1 when this runner held it (it is freed)
-- Bound: one key.
local op, me, ttl = ARGV[1], ARGV[2], ARGV[3]
local holder = redis.call('GET', KEYS[1])
if op == 'acquire' then
  if not holder then redis.call('SET', KEYS[1], me, 'PX', ttl) return 1 end
  if holder == me then redis.call('PEXPIRE', KEYS[1], ttl) return 1 end
  return 0
elseif op == 'renew' then
  if holder == me then redis.call('PEXPIRE', KEYS[1], ttl) return 1 end
  return 0
else
  if holder == me then redis.call('DEL', KEYS[1]) return 1 end
  return 0
end
