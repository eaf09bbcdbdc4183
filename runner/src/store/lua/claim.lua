-- Claims up to ARGV[1] due tasks of one shard: due -> inflight with a lease of ARGV[2] ms and
-- attempts + 1. Nothing is deleted: the record stays until the outcome is recorded.
-- Expired leases are reaped first, so a claim also recovers the tasks of a dead runner.
-- The clock is Redis TIME, one clock for all runners; a task is never claimed before its due time.
-- Returns {now, next_due (-1: none), next_lease_expiry (-1: none),
--          then 8 per task: id, attempt, due, max, plugin, owner, payload, created}.
local limit, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
reap_expired(now, limit)
local out = { now, 0, 0 }
local ids = redis.call('ZRANGEBYSCORE', K_DUE, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  local t = parse(redis.call('HGET', K_TASKS, id))
  if not t or t.st ~= 's' then
    redis.call('ZREM', K_DUE, id) -- an index entry without a scheduled record: repair
  else
    unindex_scheduled(id, t)
    t.st = 'r'
    t.att = t.att + 1
    redis.call('HSET', K_TASKS, id, encode(t))
    redis.call('ZADD', K_INFLIGHT, now + lease, id)
    local n = #out
    out[n + 1] = id; out[n + 2] = t.att; out[n + 3] = t.due; out[n + 4] = t.max
    out[n + 5] = t.plugin; out[n + 6] = t.owner; out[n + 7] = t.payload; out[n + 8] = t.created
  end
end
out[2] = head_due()
local l = redis.call('ZRANGE', K_INFLIGHT, 0, 0, 'WITHSCORES')
out[3] = l[2] and tonumber(l[2]) or -1
return out
