#!lua flags=allow-oom
-- A plugin's rate limit across all runners, as the service the plugin calls sees it: starts at
-- least `per_ms / max` ms apart, so at most `max` in any `per_ms` ms, by Redis's clock. A start
-- is recorded when the run starts, not when it was reserved: a run that comes back late from its
-- wait can't bunch with the runs after it.
-- KEYS[1]: the plugin's starts (ZSET run -> time ms, the last `per_ms` of them);
-- KEYS[2]: the runs waiting for a start (ZSET run -> the start reserved for it).
-- ARGV: run (task key, tab, attempt), max, per_ms.
-- Returns 0 when the run starts now (recorded), else the ms until the start reserved for it. Runs
-- that wait are reserved starts one interval apart after the last start and the last reservation,
-- so they come back in the order they asked; one that comes back before the interval since the
-- last start has passed (the run before it came back late) is reserved again for that moment.
-- Bound: a trim of the plugin's starts older than `per_ms` (at most `max` are kept) and O(log n) in
--  its waiting runs.
local starts, queue = KEYS[1], KEYS[2]
local run, max, per = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local gap = per / max
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- (a start in the future is a reservation 0.1.0 kept in the same ZSET: not a start)
redis.call('ZREMRANGEBYSCORE', starts, '-inf', now - per)
redis.call('ZREMRANGEBYSCORE', starts, '(' .. now, '+inf')
-- a reservation whose run never came back (cancelled, or its runner died) goes after a window
redis.call('ZREMRANGEBYSCORE', queue, '-inf', now - per - 60000)

-- the earliest the next start may be: one gap after the last, and no more than `max` in a window
local earliest = now
local last = redis.call('ZRANGE', starts, -1, -1, 'WITHSCORES')
if last[2] then earliest = math.max(earliest, tonumber(last[2]) + gap) end
local n = redis.call('ZCARD', starts)
if n >= max then
  local nth = redis.call('ZRANGE', starts, n - max, n - max, 'WITHSCORES')
  earliest = math.max(earliest, tonumber(nth[2]) + per)
end

local function start()
  redis.call('ZREM', queue, run)
  redis.call('ZADD', starts, now, run)
  redis.call('PEXPIRE', starts, per + 1000)
  return 0
end
local function reserve(at)
  redis.call('ZADD', queue, at, run)
  redis.call('PEXPIRE', queue, math.ceil(at - now + per + 60000))
  return math.max(1, math.ceil(at - now))
end

local mine = redis.call('ZSCORE', queue, run)
if mine then
  mine = tonumber(mine)
  if mine > now then return math.ceil(mine - now) end
  if earliest <= now then return start() end
  return reserve(earliest)
end
-- a new run: after every run already waiting
local behind = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
if behind[2] then earliest = math.max(earliest, tonumber(behind[2]) + gap) end
if earliest <= now then return start() end
return reserve(earliest)
