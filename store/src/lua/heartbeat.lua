#!lua flags=allow-oom
-- A runner's heartbeat, in Redis time. KEYS: runners (ZSET id -> last beat), the runner's info key.
-- ARGV: runner id, info (JSON), ttl ms, window ms.
-- Returns {Redis's clock (ms), {the ids of the runners heard from within `window` ms (this one
-- included), sorted}}.
-- Bound: O(log n) in the runners' ZSET, plus dropping the runners gone quiet (each heartbeat writes
--  one).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, info, ttl, window = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('SET', KEYS[2], info, 'PX', ttl)
redis.call('ZADD', KEYS[1], now, id)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 10 * ttl)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - window, '+inf')
table.sort(live)
return { now, live }
