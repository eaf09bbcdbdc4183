--! part claims
--! needs shard record buckets indexes
-- Claim batches and their leases: a claim takes due tasks under one token and one lease
-- (`claim_leases` token -> lease end, `batches` token -> its ids); a batch leaves both when its
-- last task's outcome is recorded, or when its lease ends (the reaper puts back the tasks still
-- running under it).

-- `n` more (or fewer, n < 0) running tasks of `plugin` (`batches` field `running:<plugin>`, read
-- by max_pending: a running task may come back to scheduled); at zero the field goes.
local function count_running(plugin, n)
  local field = 'running:' .. plugin
  if redis.call('HINCRBY', K_BATCHES, field, string.format('%d', n)) <= 0 then
    redis.call('HDEL', K_BATCHES, field)
  end
end

-- The plugin of a running task from its key (`<plugin>\31<id>`), or from its record `rec` for a
-- key 0.1.0 wrote (a bare id).
local function plugin_of(id, rec)
  return string.match(id, '^([^\31]+)\31') or parse(rec).plugin
end

-- The lowest score of the ZSET `key` (nil when it is empty).
local function first_score(key)
  return tonumber(redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')[2])
end

-- The first claim of the rerun chain that `rerun` (an entry of K_RERUN, or false) names for a
-- task about to be claimed with `created` and `att` (attempts before this claim), or nil when the
-- entry is of another occurrence or an outcome was recorded since (attempts moved on).
local function rerun_of(rerun, created, att)
  if not rerun then return nil end
  local c, a, token = string.match(rerun, '^(%d+) (%d+) (%d+)$')
  if c == created and tonumber(a) == att then return token end
  return nil
end

-- A running task `t` (claim t.fin, attempt t.att) loses its lease: its next claim must commit
-- effects under the first claim of the chain (this one, unless it was itself a rerun).
local function note_rerun(id, t)
  local first = rerun_of(redis.call('HGET', K_RERUN, id), t.created, t.att - 1) or t.fin
  redis.call('HSET', K_RERUN, id, t.created .. ' ' .. string.format('%d', t.att) .. ' ' .. first)
end

-- A running task `t` whose lease ended goes back to due at `now`, or is dead-lettered when that
-- attempt was its last.
local function reap(id, t, now)
  count_running(t.plugin, -1)
  t.err = 'lease expired during attempt ' .. t.att .. ' (its runner died or stalled)'
  if t.att >= t.max then
    bury(id, t, now, t.err)
    start_unique_window(id, now)
    redis.call('HDEL', K_RERUN, id)
  else
    note_rerun(id, t)
    t.st = 's'; t.due = now; t.fin = ''
    redis.call('HSET', K_TASKS, id, encode(t))
    index_scheduled(id, t)
  end
end

-- Puts back the tasks whose lease ended (their runner died or stalled): whole claim batches,
-- the earliest first, until `limit` ids were looked at (so one script does at most `limit` plus
-- one batch of work).
local function reap_expired(now, limit)
  local seen = 0
  while seen < limit do
    local token = redis.call('ZRANGEBYSCORE', K_CLAIM_LEASES, '-inf', now - 1, 'LIMIT', 0, 1)[1]
    if not token then break end
    local b = redis.call('HMGET', K_BATCHES, token, token .. ':n')
    redis.call('ZREM', K_CLAIM_LEASES, token)
    redis.call('HDEL', K_BATCHES, token, token .. ':n')
    redis.call('HINCRBY', K_BATCHES, 'running', -(tonumber(b[2]) or 0))
    seen = seen + 1
    if b[1] then
      local ids = {}
      for id in string.gmatch(b[1], '[^\t]+') do ids[#ids + 1] = id end
      seen = seen + #ids
      local recs = records_of(ids)
      for i, id in ipairs(ids) do
        if holds(recs[i], token) then reap(id, parse(recs[i]), now) end
      end
    end
  end
end

-- Claims `ids` (claimed under `token`, lease ending at `expires`) as one batch.
local function lease_batch(token, ids, expires)
  if #ids == 0 then return end
  local n = string.format('%d', #ids)
  redis.call('HSET', K_BATCHES, token, table.concat(ids, '\t'), token .. ':n', n)
  redis.call('HINCRBY', K_BATCHES, 'running', n)
  redis.call('ZADD', K_CLAIM_LEASES, expires, token)
end

-- Outcomes were recorded for tasks claimed under the tokens `done` counts (token -> how many):
-- a batch none of whose tasks still runs leaves `claim_leases` and `batches`.
local function release_batches(done)
  local total = 0
  for token, k in pairs(done) do
    total = total + k
    if redis.call('HINCRBY', K_BATCHES, token .. ':n', string.format('%d', -k)) <= 0 then
      redis.call('HDEL', K_BATCHES, token, token .. ':n')
      redis.call('ZREM', K_CLAIM_LEASES, token)
    end
  end
  if total > 0 then
    redis.call('HINCRBY', K_BATCHES, 'running', string.format('%d', -total))
  end
end

-- How long (ms) the runner holding a task claimed ahead has to revoke it, once asked.
local REVOKE_MS = 200

-- A request is read and dropped by its asker (`revoke.lua wait`); one whose asker died first is
-- left behind. So each new request sweeps up to REVOKE_SWEEP fields of `batches` on from where
-- the last sweep stopped (a cursor in meta 'rv-sweep'), dropping the requests whose deadline
-- passed more than REVOKE_STALE_MS ago: no asker waits that long (its wait ends 2 s after it
-- asked, by its own clock), and the holder can't apply a request past its deadline.
local REVOKE_STALE_MS, REVOKE_SWEEP = 5000, 32
local function sweep_revocations(now)
  local cursor = redis.call('HGET', K_META, 'rv-sweep') or '0'
  local r = redis.call('HSCAN', K_BATCHES, cursor, 'MATCH', 'rv\31*', 'COUNT',
    string.format('%d', REVOKE_SWEEP))
  local fields = r[2]
  for i = 1, #fields, 2 do
    local deadline = tonumber(string.match(fields[i + 1], '^%d+ (%d+) '))
    if deadline and now > deadline + REVOKE_STALE_MS then
      redis.call('HDEL', K_BATCHES, fields[i])
    end
  end
  if r[1] == '0' then
    redis.call('HDEL', K_META, 'rv-sweep')
  else
    redis.call('HSET', K_META, 'rv-sweep', r[1])
  end
end

-- A cancel (action 'c') or a move to `value` (action 'm') of the task `t` (parsed), running under
-- its claim and not started (due after `now`: a task claimed ahead), asks its runner to revoke it
-- (see `revoke.lua`): the request, then a message to every runner on the wake channel. Requests
-- left behind by askers that died are swept first.
local function ask_revoke(channel, shard, id, t, action, value, now)
  sweep_revocations(now)
  redis.call('HSET', K_BATCHES, 'rv\31' .. id,
    string.format('%s %d %s %d p', t.fin, now + REVOKE_MS, action, value))
  redis.call('PUBLISH', channel, 'v' .. shard .. ':' .. t.fin .. ':' .. id)
end
