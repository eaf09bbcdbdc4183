#!lua flags=allow-oom
-- The concurrency slots of one plugin across all runners of the namespace: a lease per run.
-- KEYS[1]: the plugin's slots (ZSET holder -> lease expiry ms). A dead runner's slots leave on
-- their own when their leases expire.
-- ARGV: op ('take' | 'give'), holder, max, lease_ms.
-- Returns, for 'take', 1 when the holder has a slot (a holder that has one renews it), else 0; for 'give', 1.
local key, op, holder = KEYS[1], ARGV[1], ARGV[2]
if op == 'give' then
  redis.call('ZREM', key, holder)
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if not redis.call('ZSCORE', key, holder) and redis.call('ZCARD', key) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', key, now + tonumber(ARGV[4]), holder)
redis.call('PEXPIRE', key, tonumber(ARGV[4]) * 2)
return 1
