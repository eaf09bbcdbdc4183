--! needs claims
-- Claims up to ARGV[1] due tasks of one shard: due -> running, under one lease of ARGV[2] ms,
-- attempts + 1, and a fresh claim token (the shard's claim counter, kept at or above Redis's
-- clock in ms × 1000) in the record's `fin` field.
-- Nothing is deleted: the record stays until the outcome is recorded.
-- Expired leases are reaped first, so a claim also recovers the tasks of a dead runner.
-- A due task of a paused plugin is parked instead (out of `due`, still scheduled, no attempt
-- used), so pollers never spin on it; resuming the plugin puts it back.
-- The clock is Redis TIME, one clock for all runners; a task is never claimed before its due time.
-- Hot path: only the record's prefix up to `fin` is rewritten (no full decode) unless the shard
-- has owners to unindex, and each key is written once per claim (variadic calls), not per task.
-- A task put back by lease expiry (in `rerun`) is returned with the first claim of that chain,
-- under whose marker its effects are committed (listed apart: most tasks have none, and every
-- value of the reply costs Redis and the runner a little).
-- KEYS: the shard's keys (the `shard` part). ARGV: limit, lease_ms.
-- The batch is one entry in `claim_leases` (its token -> lease end) and one in `batches` (its ids), not
-- one per task.
-- Returns {now, next_due (-1: none), next_lease_expiry (-1: none), token, {the reruns: per task
-- that has a first claim, its place among the tasks (1-based) and that claim}, then per task:
-- id, record}.
-- (Every redis.call costs Redis a command's dispatch whatever its size, and a Lua number passed
-- to one is printed as a double: a claim of one task is mostly that fixed cost, so numbers go
-- as strings and the reaper's reads happen only when a lease has ended.)
local limit, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
-- the earliest lease ends, read once: reaping only when one has passed, and the claim's answer
-- (the next lease end) from them unless it reaped
local lease_head = first_score(K_CLAIM_LEASES)
local reaped = lease_head and lease_head < now
if reaped then reap_expired(now, limit) end
local firsts = {}
local out = { now, 0, 0, 0, firsts }
local ids, head = due_take(now, limit)
if #ids == 0 then
  out[2] = head or head_due()
else
  -- the shard's claim counter, never below Redis's clock in µs-sized steps of ms: when Redis
  -- loses its last writes (an AOF `everysec` restart, a failover before the replica had them)
  -- the counter may go back, but the clock does not, so a new claim never repeats the token of
  -- a claim whose runner still holds it (now * 1000 stays below 2^53: exact in Lua's doubles)
  local token = redis.call('HINCRBY', K_META, 'claim', '1')
  if token < now * 1000 then
    token = now * 1000
    redis.call('HSET', K_META, 'claim', string.format('%d', token))
  end
  token = string.format('%d', token)
  out[4] = token
  local owners = redis.call('EXISTS', K_BYOWNER) == 1
  local recs = records_of(ids)
  local reruns = {}
  if redis.call('EXISTS', K_RERUN) == 1 then reruns = hmget(K_RERUN, ids) end
  -- every write of the batch goes in one variadic call per key
  local parked, unowner, records, claimed, counts = {}, {}, {}, {}, {}
  local expires = string.format('%d', now + lease)
  for i, id in ipairs(ids) do
    local rec = recs[i]
    local due, att, mc, rest, plugin
    if rec then
      due, att, mc, rest, plugin = string.match(rec, '^s\t(%-?%d+)\t(%d+)\t(%d+\t%d+\t)%d*\t(([^\t]*).*)$')
    end
    if due then -- (else an index entry without a scheduled record: repaired by its removal)
      if is_paused(plugin) then
        push(parked, due, id)
      else
        if owners then
          local t = parse(rec)
          if t.owner ~= '' then unowner[#unowner + 1] = owner_member(t.owner, t.due, id) end
        end
        counts[plugin] = (counts[plugin] or 0) + 1
        rec = 'r\t' .. due .. '\t' .. string.format('%d', tonumber(att) + 1) .. '\t' .. mc .. token
          .. '\t' .. rest
        push(records, id, rec)
        claimed[#claimed + 1] = id
        push(out, id, rec)
        local first = reruns[i]
        if first then first = rerun_of(first, string.match(mc, '\t(%d+)\t$'), tonumber(att)) end
        if first then push(firsts, #claimed, first) end
      end
    end
  end
  call_many('ZADD', K_PARKED, parked)
  call_many('ZREM', K_BYOWNER, unowner)
  for p, k in pairs(counts) do count_scheduled(p, -k) end
  call_many('HSET', K_TASKS, records)
  lease_batch(token, claimed, expires)
  if #claimed > 0 and not reaped then
    lease_head = math.min(lease_head or now + lease, now + lease)
  end
  -- (parking puts nothing back in a bucket: the earliest seen on the way still is)
  out[2] = head or head_due()
end
if reaped then lease_head = first_score(K_CLAIM_LEASES) end
out[3] = lease_head or -1
return out
