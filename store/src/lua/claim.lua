#!lua
--! needs claims share owners
-- Claims up to ARGV[1] due tasks of one shard: due -> running, under one lease of ARGV[2] ms,
-- attempts + 1, and a fresh claim token (the shard's claim counter, kept at or above Redis's
-- clock in ms × 1000) in the record's `fin` field.
-- Nothing is deleted: the record stays until the outcome is recorded.
-- Expired leases are reaped first, so a claim also recovers the tasks of a dead runner.
-- A due task of a paused plugin or owner is parked instead (out of `due`, still scheduled, no
-- attempt used), so pollers never spin on it; resuming the plugin or owner puts it back.
-- Fair share (see `share`): ARGV[3] is how many tasks the claiming runner holds of each plugin,
-- and its weight ('p1\tn1\tw1\t...'); each place goes to the plugin holding the fewest for its
-- weight. When ARGV[4] > 0 (one plugin holds much of the runner) and more than one plugin may
-- have tasks due here (by their heads: see `count_scheduled`), the claim walks up to that many
-- due tasks beyond its size to find others, and sets aside what it walked and did not take.
-- The last ARGV[5] places go only to plugins not crowding the runner: holding at most ARGV[6],
-- or under half of what the plugin holding the most holds.
-- Owners' fair share (see `owners`): where two or more owners have tasks due here, the due tasks
-- walked come in owners' turns instead of in due order alone.
-- Priority (see `priority`): where the shard has tasks of priority > 0, those due ARGV[7] ms ago
-- or earlier come first, then the higher priority's, each in due order (and inside an owner's
-- turn, the higher first).
-- Claim ahead: ARGV[8] ms (0 when absent) is how far past Redis's clock a task may fall due and be
-- claimed; the runner starts such a task at its due time (a timer of its own). 0: only tasks due
-- now, as a runner that is not under a steady load asks.
-- The clock is Redis TIME, one clock for all runners; a task is never claimed earlier than its due
-- time less ARGV[8].
-- Hot path: only the record's prefix up to `fin` is rewritten (no full decode) unless the shard
-- has owners to unindex, and each key is written once per claim (variadic calls), not per task.
-- A task put back by lease expiry (in `rerun`) is returned with the first claim of that chain,
-- under whose marker its effects are committed (listed apart: most tasks have none, and every
-- value of the reply costs Redis and the runner a little).
-- KEYS: the shard's keys (the `shard` part). ARGV: limit, lease_ms, held, extra, headroom, part,
-- aging_ms, ahead_ms.
-- The batch is one entry in `claim_leases` (its token -> lease end) and one in `batches` (its ids), not
-- one per task.
-- Returns: a flat array of named slots (`local NOW, ...` below; the runner decodes them by the
-- same names, `claim_slots` in store/src/tasks.rs), then per task claimed its id and record:
--   NOW         Redis's time (ms)
--   NEXT_DUE    when the next scheduled task here is due (-1: none)
--   LEASE_HEAD  when the next claim lease here ends (-1: none)
--   TOKEN       the claim's token
--   RERUNS      {per task that has a first claim: its place among the tasks (1-based), that claim}
--   SET_ASIDE   how many tasks were set aside for fair share
--   WAITING     whether due tasks are left waiting (0: none; 1: of plugins holding their part or
--               more; 2: of a plugin under its part too)
--   OTHERS_HERE whether a plugin under its part has tasks scheduled here that may be due (1, or
--               0: only crowding plugins; always 1 when ARGV[4] is 0)
--   OTHERS_DUE  when OTHERS_HERE is 0, the earliest a plugin under its part may have a task due
--               here (-1: none)
--   NOW_US      the µs of Redis's time past NOW (0–999): a runner starts a task claimed ahead
--               that much sooner after the answer, still never before its due time
-- (Every redis.call costs Redis a command's dispatch whatever its size, and a Lua number passed
-- to one is printed as a double: a claim of one task is mostly that fixed cost, so numbers go
-- as strings and the reaper's reads happen only when a lease has ended.)
-- Bound: at most the claim's size (`--claim-batch`) plus the walk past it (ARGV[4]), and the
--  expired claim batches it reaps (each batch's tasks: at most a claim's size); at most
--  CLAIM_BYTES of records taken past the first, and read (WALK_BYTES where it looks at more than
--  it takes) and one piece (READ_MOST records) past that: the rest stay in or go back to their
--  buckets unread, or are set aside in `waiting`.
-- The most bytes of records one claim takes (and so answers with), past its first task: a
-- claim of 256 tasks of 60 KB would copy 15 MB in one call.
local CLAIM_BYTES = 524288
-- The most bytes of records a claim reads when it walks past its size for plugins' fair share,
-- or looks at tasks waiting (60 KB records would be 46 MB for a walk of 768): Redis hands a
-- script a record at about 2 ms a MB on a small machine, so the bytes read, not the tasks
-- walked, are what a claim costs. Records are read in pieces: READ_FIRST, then each of as many
-- as the bytes left hold of the largest read so far, at most READ_MOST; so a claim reads at most
-- its bound and one piece past it.
local WALK_BYTES, READ_FIRST, READ_MOST = CLAIM_BYTES, 4, 16
local function read_size(left, biggest)
  if biggest == 0 then return READ_FIRST end
  return math.max(1, math.min(READ_MOST, math.floor(left / biggest)))
end
local limit, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local held, weights, most = parse_held(ARGV[3] or '')
local extra = tonumber(ARGV[4]) or 0
local headroom, part = math.min(tonumber(ARGV[5]) or 0, limit), tonumber(ARGV[6]) or 0
local aging = tonumber(ARGV[7]) or 60000
local now, now_us = now_ms_us()
-- what counts as due: up to `ahead` ms past now (the tasks a runner claims ahead)
local due_by = now + math.max(0, math.min(tonumber(ARGV[8]) or 0, 1000))
-- the earliest lease ends, read once: reaping only when one has passed, and the claim's answer
-- (the next lease end) from them unless it reaped
local lease_head = first_score(K_CLAIM_LEASES)
local reaped = lease_head and lease_head < now
if reaped then reap_expired(now, limit) end
local firsts = {}
local NOW, NEXT_DUE, LEASE_HEAD, TOKEN, RERUNS, SET_ASIDE, WAITING, OTHERS_HERE, OTHERS_DUE, NOW_US = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
local out = { now, 0, 0, 0, firsts, 0, 0, 1, -1, now_us } -- in the order of the names above
-- walk past the claim's size only where another plugin's tasks may be found behind a backlog:
-- when more than one plugin may have tasks due here (a plugin whose tasks all fall due later is
-- as if it were not here: a burst is not set aside for it). Where one plugin alone may have
-- tasks due, headroom places go to it only while it holds less than `part`.
local walk, due, later = limit, nil, nil
if extra > 0 or headroom > 0 then
  due, later = due_plugins(due_by, held, part, most)
  if #due > 1 then
    walk = limit + extra
  elseif headroom > 0 then
    if not not_crowding(held[due[1] or ''] or 0, part, most) then walk = limit - headroom end
    headroom = 0
  end
end
-- (the owner index exists where some scheduled task has an owner: then owners take turns)
local has_owners = redis.call('EXISTS', K_BYOWNER) == 1
-- (the takes note what they take, so what the claim does not read goes back or aside unread;
-- a take of the claim's size in due order leaves them in their buckets until the claim knows)
note_takes()
local ids, head = fair_take(due_by, walk, has_owners, aging, walk == limit)
local waits = waiting_due(due_by, limit)
-- the tasks to claim, in due order (parallel lists: no table per task on the hot path)
local c_ids, c_recs, c_dues, c_atts, c_mcs, c_rests, c_plugins = {}, {}, {}, {}, {}, {}, {}
local parked = {}
-- the tasks set aside for a later claim (out of the buckets, into `parked` and `waiting`)
local aside, aside_ids = {}, {}
local function set_aside(plugin, due, id)
  push(aside, '0', wait_member(plugin, due, id))
  push(aside_ids, string.format('%d', due), id)
end
local function take(id, rec, due, att, mc, rest, plugin)
  local i = #c_ids + 1
  c_ids[i], c_recs[i], c_dues[i], c_atts[i], c_mcs[i], c_rests[i], c_plugins[i] =
    id, rec, due, att, mc, rest, plugin
end
-- a scheduled record's due, attempts, max and created, and where its plugin starts (the rest is
-- taken with one copy: a `(.*)` capture walks it a character at a time, ~0.5 ms for 60 KB)
local RECORD_HEAD = '^s\t(%-?%d+)\t(%d+)\t(%d+\t%d+\t)%d*\t()([^\t]*)'
local function fields(rec)
  if rec then
    local due, att, mc, at, plugin = string.match(rec, RECORD_HEAD)
    if due then return due, att, mc, string.sub(rec, at), plugin end
  end
end
-- the earliest due of the tasks walked and put back for the next claim (past CLAIM_BYTES)
local back_head = nil
if #waits == 0 and #ids <= limit - headroom then
  -- every task walked is taken (the common case: one claim's worth, no one set aside), up to
  -- CLAIM_BYTES of records, read in pieces: the rest stay for the next claim, due at once. A
  -- peeking take left them in their buckets (only the first `kept` leave); else they go back
  -- to their buckets in due order, those not read by what the takes noted of them (or, when
  -- owners' turns moved heads and their owner is unknown, aside in `waiting`)
  local n, bytes, back, back_heads, back_prios = 0, 0, {}, {}, {}
  local kept, stopped = 0, false
  local function one(id, rec)
    local due, att, mc, rest, plugin
    if rec then
      due, att, mc, rest, plugin = fields(rec)
    end
    if not due then
      -- an index entry without a scheduled record: repaired by its removal
      if not stopped then kept = kept + 1 end
    elseif not stopped and (is_paused(plugin)
        or (owners_marked() and owner_paused(owner_of(rest), plugin))) then
      push(parked, due, id)
      kept = kept + 1
    elseif stopped or (n > 0 and bytes + #rec > CLAIM_BYTES) then
      if not stopped then back_head = tonumber(due) end
      stopped = true
      if not peeked then
        push(back, due, id)
        prio_push(back_prios, record_priority(rec), tonumber(due), id)
        local owner = owner_of(rest)
        if owner ~= '' then push(back_heads, due, plugin .. '\0' .. owner) end
      end
    else
      n = n + 1
      kept = kept + 1
      bytes = bytes + #rec
      c_ids[n], c_recs[n], c_dues[n], c_atts[n], c_mcs[n], c_rests[n], c_plugins[n] =
        id, rec, due, att, mc, rest, plugin
    end
  end
  -- (what is read counts, parked or not: a paused plugin's backlog is parked a piece a claim)
  local at, read, biggest = 1, 0, 0
  while at <= #ids and not stopped and read < CLAIM_BYTES do
    local chunk = {}
    for j = at, math.min(at + read_size(CLAIM_BYTES - read, biggest) - 1, #ids) do
      chunk[#chunk + 1] = ids[j]
    end
    for k, rec in ipairs(records_of(chunk)) do
      if rec then
        read = read + #rec
        biggest = math.max(biggest, #rec)
      end
      one(chunk[k], rec)
    end
    at = at + #chunk
  end
  if peeked then
    peeked_drop(kept)
    -- (those left unread are due, or within the claim's window)
    if kept < #ids and not back_head then back_head = now end
  else
    local bare = {}
    for i = at, #ids do
      local id = ids[i]
      local due, plugin, who = taken_dues[id], string.match(id, '^([^\31]*)\31'), taken_owners[id]
      if not (due and plugin) then
        bare[#bare + 1] = id -- (a record 0.1.0 wrote under its bare id: read after all)
      elseif who or not turns_taken then
        local d = string.format('%d', due)
        push(back, d, id)
        if taken_prios[id] then push(back_prios, '0', taken_prios[id]) end
        if who then push(back_heads, d, who) end
      else
        set_aside(plugin, due, id)
      end
    end
    stopped = stopped or #bare > 0
    for k, rec in ipairs(records_of(bare)) do one(bare[k], rec) end
    if #back > 0 then
      due_add(back)
      prio_add(back_prios)
      lower_owner_heads(back_heads)
      back_head = tonumber(back[1])
    end
  end
  call_many('ZADD', K_PARKED, parked)
  if #aside > 0 then
    call_many('ZADD', K_PARKED, aside_ids)
    call_many('ZADD', K_WAITING, aside)
    out[WAITING] = 2
  end
elseif #ids > 0 or #waits > 0 then
  -- (every task walked leaves its bucket here: taken, or set aside)
  if peeked then
    peeked_dues()
    peeked_drop(#ids)
  end
  -- the candidates, in due order: {due, id, plugin, rec, att, mc, rest, member (when waiting)}
  local cands, stale = {}, {}
  local function add(id, rec, member)
    local due, att, mc, rest, plugin = fields(rec)
    if not due then
      if member then stale[#stale + 1] = member end
    elseif member == nil and is_paused(plugin) then
      push(parked, due, id)
    elseif owners_marked() and owner_paused(owner_of(rest), plugin) then
      -- (one set aside for its plugin's share before its owner was paused stays parked; it
      -- leaves `waiting` so its share passes to the others)
      if member then stale[#stale + 1] = member else push(parked, due, id) end
    else
      cands[#cands + 1] = { due = tonumber(due), k = #cands, id = id, plugin = plugin, rec = rec,
        att = att, mc = mc, rest = rest, member = member }
    end
  end
  -- what the claim looks at, before a record is read, in the order `choose` sees it (the
  -- walk's; in due order where tasks wait): {id, plugin, due, member (when waiting), k, rec}. A
  -- walked task whose plugin the key does not say (a record 0.1.0 wrote under its bare id) is
  -- read at once.
  local items, unknown = {}, {}
  for i, id in ipairs(ids) do
    local it = { id = id, k = i, plugin = string.match(id, '^([^\31]*)\31'),
      due = taken_dues and taken_dues[id] }
    items[i] = it
    if not (it.plugin and it.due) then unknown[#unknown + 1] = it end
  end
  local read = 0
  if #unknown > 0 then
    local uids = {}
    for i, it in ipairs(unknown) do uids[i] = it.id end
    for i, rec in ipairs(records_of(uids)) do
      local it = unknown[i]
      it.rec = rec
      local due, _, _, _, plugin = fields(rec)
      it.due, it.plugin = tonumber(due) or -1, plugin or ''
      if rec then read = read + #rec end
    end
  end
  for i, w in ipairs(waits) do
    items[#items + 1] = { id = w[2], k = #ids + i, plugin = w[3], due = w[1], member = w[4] }
  end
  if #waits > 0 then
    table.sort(items, function(a, b)
      if a.due ~= b.due then return a.due < b.due end
      return a.k < b.k
    end)
  end
  -- then up to WALK_BYTES of records, each plugin's next in turn (what `choose` can take of a
  -- plugin is its first ones), in pieces (`read_size`)
  local groups, active = {}, {}
  for _, it in ipairs(items) do
    if it.rec == nil then
      local g = groups[it.plugin]
      if not g then
        g = {}
        groups[it.plugin] = g
        active[#active + 1] = g
      end
      g[#g + 1] = it
    end
  end
  local order, depth = {}, 1
  while #active > 0 do
    local still = {}
    for _, g in ipairs(active) do
      order[#order + 1] = g[depth]
      if g[depth + 1] then still[#still + 1] = g end
    end
    active, depth = still, depth + 1
  end
  local at, biggest = 1, 0
  while at <= #order and read < WALK_BYTES do
    local chunk = {}
    for j = at, math.min(at + read_size(WALK_BYTES - read, biggest) - 1, #order) do
      chunk[#chunk + 1] = order[j].id
    end
    for j, rec in ipairs(records_of(chunk)) do
      order[at + j - 1].rec = rec
      if rec then
        read = read + #rec
        biggest = math.max(biggest, #rec)
      end
    end
    at = at + #chunk
  end
  -- what was walked and not taken is set aside (a task walked and not read too, with the due
  -- and plugin the walk noted); what was waiting and is taken leaves `waiting`; past
  -- CLAIM_BYTES of records a chosen task is set aside too, for the next claim
  local taken_waiting, taken_ids = {}, {}
  for _, it in ipairs(items) do
    if it.rec ~= nil then
      add(it.id, it.rec, it.member)
    else
      -- (one waiting stays there; either way the poller claims again at once)
      out[WAITING] = 2
      if not it.member then set_aside(it.plugin, it.due, it.id) end
    end
  end
  call_many('ZREM', K_WAITING, stale)
  local queues = choose(cands, held, weights, most, limit, headroom, part)
  local bytes = 0
  for _, c in ipairs(cands) do
    if c.chosen and #c_ids > 0 and bytes + #c.rec > CLAIM_BYTES then
      c.chosen = false
      out[WAITING] = 2
    end
    if c.chosen then
      bytes = bytes + #c.rec
      take(c.id, c.rec, string.format('%d', c.due), c.att, c.mc, c.rest, c.plugin)
      if c.member then
        taken_waiting[#taken_waiting + 1] = c.member
        taken_ids[#taken_ids + 1] = c.id
      end
    else
      -- left waiting: 2 when a plugin under its part is among them (headroom may take them)
      if queues[c.plugin].under then out[WAITING] = 2 elseif out[WAITING] == 0 then out[WAITING] = 1 end
      if not c.member then set_aside(c.plugin, c.due, c.id) end
    end
  end
  call_many('ZADD', K_PARKED, parked)
  call_many('ZADD', K_PARKED, aside_ids)
  call_many('ZADD', K_WAITING, aside)
  call_many('ZREM', K_PARKED, taken_ids)
  call_many('ZREM', K_WAITING, taken_waiting)
  out[SET_ASIDE] = #aside_ids / 2
end
if #c_ids > 0 then
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
  out[TOKEN] = token
  local owners = has_owners
  local reruns = {}
  if redis.call('EXISTS', K_RERUN) == 1 then reruns = hmget(K_RERUN, c_ids) end
  -- every write of the batch goes in one variadic call per key
  local unowner, records, counts, taken_owners = {}, {}, {}, {}
  -- the priority index's entries of the tasks taken (those `prio_take` took already left it)
  local prios = has_priorities() and {} or nil
  local expires = string.format('%d', now + lease)
  for i, id in ipairs(c_ids) do
    if owners then
      local t = parse(c_recs[i])
      if t.owner ~= '' then
        unowner[#unowner + 1] = owner_member(t.owner, t.due, id)
        taken_owners[t.owner] = taken_owners[t.owner] or {}
        taken_owners[t.owner][t.plugin] = true
      end
    end
    local plugin = c_plugins[i]
    counts[plugin] = (counts[plugin] or 0) + 1
    if prios then
      local p = record_priority(c_recs[i])
      if p > 0 then prios[#prios + 1] = prio_member(p, tonumber(c_dues[i]), id) end
    end
    local rec = 'r\t' .. c_dues[i] .. '\t' .. string.format('%d', tonumber(c_atts[i]) + 1) .. '\t'
      .. c_mcs[i] .. token .. '\t' .. c_rests[i]
    push(records, id, rec)
    push(out, id, rec)
    local first = reruns[i]
    if first then
      first = rerun_of(first, string.match(c_mcs[i], '\t(%d+)\t$'), tonumber(c_atts[i]))
    end
    if first then push(firsts, i, first) end
  end
  call_many('ZREM', K_BYOWNER, unowner)
  if prios then call_many('ZREM', prio_key(), prios) end
  drop_owner_heads(taken_owners)
  for p, k in pairs(counts) do
    count_scheduled(p, -k)
    count_running(p, k)
  end
  call_many('HSET', K_TASKS, records)
  lease_batch(token, c_ids, expires)
  if not reaped then
    lease_head = math.min(lease_head or now + lease, now + lease)
  end
end
-- (parking puts nothing back in a bucket: the earliest seen on the way still is; tasks put
-- back past CLAIM_BYTES are due now, before any left in the buckets)
out[NEXT_DUE] = back_head or head or head_due()
-- for a runner one plugin crowds: whether a plugin under its part may have tasks due here
-- (else a claim with headroom could only take the crowding plugin's: the poller then waits for
-- room instead, or until `later`, when such a plugin's first task may fall due)
if extra > 0 and out[WAITING] ~= 2 then
  out[OTHERS_HERE] = 0
  for _, p in ipairs(due) do
    if not_crowding(held[p] or 0, part, most) then out[OTHERS_HERE] = 1 break end
  end
  if out[OTHERS_HERE] == 0 and later then out[OTHERS_DUE] = string.format('%d', later) end
end
if reaped then lease_head = first_score(K_CLAIM_LEASES) end
out[LEASE_HEAD] = lease_head or -1
return out
