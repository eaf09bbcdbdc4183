#!lua flags=allow-oom
-- The concurrency slots of one plugin (or of one owner's tasks of it) across all runners of the
-- namespace: a lease per run, and the runs waiting for one.
-- KEYS[1]: the slots (ZSET holder -> lease expiry ms). A dead runner's slots leave on their own
-- when their leases expire.
-- KEYS[2]: the runs waiting (ZSET `id\tcreated` -> due ms): tasks that found every slot taken
-- and were put back to wait; a slot given back wakes the earliest due.
-- ARGV: op and its arguments; Returns what each op says:
--   'take' holder, max, lease_ms -> 1 when the holder has a slot (a holder that has one renews
--          it), else 0
--   'give' holder -> the waiting run popped to be woken (`id\tcreated`), or false when none waits
--   'wait' run (`id\tcreated`), max, due -> 1 when a slot is free now (the caller wakes the run
--          itself), else 0 with the run added to the waiting
-- Bound: O(log n) in the plugin's slots and waiting runs, plus the expired slots it drops (each run
--  takes one).
local key, waiting, op = KEYS[1], KEYS[2], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if op == 'give' then
  redis.call('ZREM', key, ARGV[2])
  local next = redis.call('ZPOPMIN', waiting)
  return next[1] or false
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if op == 'wait' then
  if redis.call('ZCARD', key) < tonumber(ARGV[3]) then return 1 end
  redis.call('ZADD', waiting, tonumber(ARGV[4]), ARGV[2])
  -- entries of runs woken or gone another way are popped by later gives; a day bounds the rest
  redis.call('PEXPIRE', waiting, 86400000)
  return 0
end
local holder = ARGV[2]
if not redis.call('ZSCORE', key, holder) and redis.call('ZCARD', key) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', key, now + tonumber(ARGV[4]), holder)
redis.call('PEXPIRE', key, tonumber(ARGV[4]) * 2)
return 1
