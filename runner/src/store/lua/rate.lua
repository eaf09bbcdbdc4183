#!lua flags=allow-oom
-- A plugin's rate limit across all runners: at most `max` starts in any `per_ms` ms.
-- KEYS[1]: the plugin's starts (ZSET run -> start time ms: starts made, and starts reserved for
-- runs that wait).
-- ARGV: run (task id, tab, attempt), max, per_ms.
-- Returns 0 when the run may start now, else the ms until its reserved start. A run over the
-- rate is given the earliest start that keeps every window within `max` after the starts made
-- and reserved before it, so runs that wait start in the order they asked; asking again before
-- that time answers the time left, at or after it 0.
local key, run, max, per = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - per)
local mine = redis.call('ZSCORE', key, run)
if mine then
  return math.max(0, tonumber(mine) - now)
end
local n = redis.call('ZCARD', key)
local at = now
if n >= max then
  -- the max-th start from the newest: the new one goes `per` after it
  local nth = redis.call('ZRANGE', key, n - max, n - max, 'WITHSCORES')
  at = math.max(now, tonumber(nth[2]) + per)
end
redis.call('ZADD', key, at, run)
redis.call('PEXPIRE', key, at - now + per + 1000)
return at - now
