#!lua flags=allow-oom
-- The concurrency slots of one plugin (or of one owner's tasks of it) across all runners of the
-- namespace: a lease per run, and the runs waiting for one.
-- KEYS[1]: the slots (ZSET holder -> lease expiry ms). A dead runner's slots leave on their own
-- when their leases expire.
-- KEYS[2]: the runs waiting (ZSET `id\tcreated\tattempts` -> due ms - priority * 2^44, see
-- `waiting_score` in store/src/slots.rs): tasks that found every slot taken and were put back to
-- wait; a slot given back wakes the one of the highest priority, the earliest due among equals,
-- or, before any, the earliest due of those due `aging` ms ago or earlier.
-- ARGV: op and its arguments; Returns what each op says:
--   'take' holder, max, lease_ms -> 1 when the holder has a slot (a holder that has one renews
--          it), else 0
--   'give' holder, aging_ms -> the waiting run popped to be woken (`id\tcreated\tattempts`), or
--          false when none waits
--   'wait' run, max, score -> 1 when a slot is free now (the caller wakes the run itself), else
--          0 with the run added to the waiting
-- Bound: O(log n) in the plugin's slots and waiting runs (times the ten priority bands, for a
--  give), plus the expired slots it drops (each run takes one).
local key, waiting, op = KEYS[1], KEYS[2], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local BAND = 17592186044416 -- 2^44
if op == 'give' then
  redis.call('ZREM', key, ARGV[2])
  local aging = tonumber(ARGV[3])
  local first = redis.call('ZRANGE', waiting, '0', '0', 'WITHSCORES')
  if not first[1] then return false end
  local pick = first[1]
  if aging and tonumber(first[2]) < 0 then
    -- priorities wait here: the earliest due of each band's first (its earliest) that waited
    -- past the aging goes before them
    local best_due = nil
    local entry = first
    while entry[1] do
      local score = tonumber(entry[2])
      local p = -math.floor(score / BAND)
      local due = score + p * BAND
      if due <= now - aging and (not best_due or due < best_due) then
        pick, best_due = entry[1], due
      end
      if p <= 0 then break end
      entry = redis.call('ZRANGEBYSCORE', waiting, string.format('%d', -(p - 1) * BAND), '+inf',
        'WITHSCORES', 'LIMIT', '0', '1')
    end
  end
  redis.call('ZREM', waiting, pick)
  return pick
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if op == 'wait' then
  if redis.call('ZCARD', key) < tonumber(ARGV[3]) then return 1 end
  -- (the score as given: a Lua number would be printed with 14 digits, and a band's has 15)
  redis.call('ZADD', waiting, ARGV[4], ARGV[2])
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
