-- Renews the leases of claimed tasks of one shard that this runner still holds.
-- ARGV: lease_ms, then per task: id, claim token.
-- Returns per task: 1 when the claim is still current (its lease now ends lease_ms from now),
-- 0 when it was lost (reaped, claimed again, finished, cancelled or replaced).
local lease = tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if holds(redis.call('HGET', K_TASKS, id), ARGV[i + 1]) then
    redis.call('ZADD', K_INFLIGHT, 'XX', now + lease, id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
