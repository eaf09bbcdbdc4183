#!lua flags=allow-oom
-- A plugin's rate limit across all runners, and its owners' (`owner_rate_limit`), as the
-- service the plugin calls sees them: starts at least `per_ms / max` ms apart, so at most `max`
-- in any `per_ms` ms, by Redis's clock. A start is recorded when the run starts, not when it was
-- reserved: a run that comes back late from its wait can't bunch with the runs after it.
-- KEYS: per limit (the plugin's, its owner's, or both), its starts (ZSET run -> time ms, the last
-- `per_ms` of them) and its runs waiting for a start (ZSET run -> the start reserved for it).
-- ARGV: run (task key, tab, attempt), then per limit its max and per_ms.
-- Returns 0 when the run starts now (recorded under every limit), else the ms until the start
-- reserved for it. Runs that wait are reserved starts one interval apart after the last start and
-- the last reservation, so they come back in the order they asked; under two limits a run is
-- reserved the later of the two starts, in both queues. One that comes back before an interval
-- since the last start has passed (the run before it came back late) is reserved again for that
-- moment.
-- Bound: per limit, a trim of its starts older than `per_ms` (at most `max` are kept) and
--  O(log n) in its waiting runs; at most two limits.
local run = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limits = {}
for i = 1, #KEYS / 2 do
  local l = { starts = KEYS[2 * i - 1], queue = KEYS[2 * i], max = tonumber(ARGV[2 * i]),
    per = tonumber(ARGV[2 * i + 1]) }
  l.gap = l.per / l.max
  -- (a start in the future is a reservation 0.1.0 kept in the same ZSET: not a start)
  redis.call('ZREMRANGEBYSCORE', l.starts, '-inf', now - l.per)
  redis.call('ZREMRANGEBYSCORE', l.starts, '(' .. now, '+inf')
  -- a reservation whose run never came back (cancelled, or its runner died) goes after a window
  redis.call('ZREMRANGEBYSCORE', l.queue, '-inf', now - l.per - 60000)
  -- the earliest the next start may be: one gap after the last, and no more than `max` in a
  -- window
  local earliest = now
  local last = redis.call('ZRANGE', l.starts, -1, -1, 'WITHSCORES')
  if last[2] then earliest = math.max(earliest, tonumber(last[2]) + l.gap) end
  local n = redis.call('ZCARD', l.starts)
  if n >= l.max then
    local nth = redis.call('ZRANGE', l.starts, n - l.max, n - l.max, 'WITHSCORES')
    earliest = math.max(earliest, tonumber(nth[2]) + l.per)
  end
  l.earliest = earliest
  l.mine = tonumber(redis.call('ZSCORE', l.queue, run))
  limits[i] = l
end

local function start()
  for _, l in ipairs(limits) do
    redis.call('ZREM', l.queue, run)
    redis.call('ZADD', l.starts, now, run)
    redis.call('PEXPIRE', l.starts, l.per + 1000)
  end
  return 0
end
local function reserve(at)
  for _, l in ipairs(limits) do
    redis.call('ZADD', l.queue, at, run)
    redis.call('PEXPIRE', l.queue, math.ceil(at - now + l.per + 60000))
  end
  return math.max(1, math.ceil(at - now))
end

local mine = nil
for _, l in ipairs(limits) do
  if l.mine and (not mine or l.mine > mine) then mine = l.mine end
end
local earliest = now
if mine then
  if mine > now then return math.ceil(mine - now) end
  for _, l in ipairs(limits) do earliest = math.max(earliest, l.earliest) end
  if earliest <= now then return start() end
  return reserve(earliest)
end
-- a new run: after every run already waiting under each limit
for _, l in ipairs(limits) do
  local e = l.earliest
  local behind = redis.call('ZRANGE', l.queue, -1, -1, 'WITHSCORES')
  if behind[2] then e = math.max(e, tonumber(behind[2]) + l.gap) end
  earliest = math.max(earliest, e)
end
if earliest <= now then return start() end
return reserve(earliest)
