#!lua flags=no-writes
-- The recurring schedules of one shard that are due, by Redis's clock (one clock for every
-- runner, whatever their own clocks say).
-- KEYS[1]: the shard's `sched` (ZSET schedule id -> next fire time, ms).
-- ARGV: limit (most schedules returned).
-- Returns {now, the earliest next fire time (-1: none), then per due schedule: id, fire time}.
-- Bound: at most ARGV[1] schedules.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = { now, -1 }
local head = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')[2]
if head then out[2] = tonumber(head) end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), 'WITHSCORES',
  'LIMIT', '0', ARGV[1])
for i = 1, #due, 2 do
  out[#out + 1] = due[i]
  out[#out + 1] = tonumber(due[i + 1])
end
return out
