#!lua flags=allow-oom
--! needs record
-- Renews the leases of claimed tasks of one shard that this runner still holds (a lease is per
-- claim batch: renewing one task of a batch renews the batch).
-- KEYS: the shard's keys (the `shard` part). ARGV: lease_ms, then per task: id, claim token.
-- Returns per task: 1 when the claim is still current (its lease now ends lease_ms from now),
-- 0 when it was lost (reaped, claimed again, finished, cancelled or replaced).
-- Bound: the tasks of the call (one runner's held tasks of one shard), each its claim batch's
--  lease.
local lease = tonumber(ARGV[1])
local now = now_ms()
local ids = {}
for i = 2, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
local recs = records_of(ids)
local out, leases, seen = {}, {}, {}
local expires = string.format('%d', now + lease)
for i, id in ipairs(ids) do
  local token = ARGV[2 * i + 1]
  if holds(recs[i], token) then
    if not seen[token] then seen[token] = true; push(leases, expires, token) end
    out[i] = 1
  else
    out[i] = 0
  end
end
call_many('ZADD', K_CLAIM_LEASES, leases, 'XX')
return out
