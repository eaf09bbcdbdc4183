#!lua flags=allow-oom
-- The ledger of what runners admitted of plugins with a max_pending of their own (one ZSET per
-- plugin on the namespace's slot, member `<n>:<unique>`). An entry is pending (score 1e13 +
-- the time it was admitted) until its tasks are written, then landed (score: the time they were).
-- A runner's pending count read from the shards misses what was admitted and not yet written
-- when it read; the ledger's pending entries and those landed since the read add it. Times are
-- this Redis's clock, so a count's read time and a landing compare exactly.
-- ARGV[1]: the op. KEYS and Returns by op:
--   'now': KEYS[1] a ledger (it routes the call); returns the time (ms).
--   'admit': KEYS one ledger per plugin; ARGV: op, member suffix, then per plugin: the time its
--     count was read, asked, room (its max_pending less that count). Admits all or none: returns
--     {0, 0}, or {i, held} for the first plugin i (1-based) without room and what its ledger held.
--   'landed': KEYS the ledgers of one admission; ARGV: op, then per ledger its member. Marks the
--     admission written.
-- Bound: one ZADD per plugin of the request (its plugins, at most the request's specs) and a
--  ZREMRANGEBYSCORE of the entries landed long enough ago, which each admission writes one of.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local PENDING = 1e13
local op = ARGV[1]
if op == 'now' then return now end
if op == 'landed' then
  for i, key in ipairs(KEYS) do
    redis.call('ZADD', key, 'XX', now, ARGV[1 + i])
  end
  return 0
end
local suffix = ARGV[2]
for i, key in ipairs(KEYS) do
  local at = 3 * i
  -- landed long ago, or pending past any write (its runner died)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - 10000)
  redis.call('ZREMRANGEBYSCORE', key, PENDING, PENDING + now - 10000)
  local held = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, ARGV[at], '+inf')) do
    held = held + tonumber(string.match(m, '^(%d+):'))
  end
  if held + tonumber(ARGV[at + 1]) > tonumber(ARGV[at + 2]) then return { i, held } end
end
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, PENDING + now, ARGV[3 * i + 1] .. ':' .. suffix)
  redis.call('PEXPIRE', key, 20000)
end
return { 0, 0 }
