#!lua flags=allow-oom
--! needs claims finished logs extras
-- Records the outcomes of a batch of claimed tasks of one shard.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, keep_done_ms, the number of logs L, then L pairs: id, the log lines of
-- its run (see the `logs` part; kept when its outcome is), then runs of tasks that share an
-- outcome: kind, claim token, value, error, count, then `count` ids. (Outcomes come in runs, not five arguments per
-- task: every argument costs Redis ~0.2 µs to parse and turn into a Lua string, and most
-- outcomes of a recording are `done` under a few claims.)
--   kind 'done'    -> the record stays in `tasks` as done, logged in `finished`; done records
--                     older than keep_done_ms are deleted here, a chunk per call
--   kind 'retry'   -> due again in `value` ms, or dead when attempts reached max_attempts
--   kind 'dead'    -> dead-lettered with `error`
--   kind 'again'   -> the same task runs again at `value` (ms), attempts reset, `created` set to
--                     now (a new occurrence: its follow-ups get new ids)
--   kind 'release' -> not started (shutdown): back to its due time, the attempt given back
--   kind 'defer'   -> not started (its plugin is at its concurrency limit): due again in `value`
--                     ms, the attempt given back
-- Fenced by the claim token: an outcome of a claim that no longer holds the task (reaped, claimed
-- again, replaced) is refused ('stale'). A late outcome of an expired lease not yet reaped is still accepted: nobody
-- else has the task, so accepting it saves a duplicate run.
-- A task that finished (done or dead) starts its dedup window, if it asked for one. The outcome of
-- a run (not 'release' or 'defer') ends its rerun chain (`rerun`): the next claim's effects are
-- its own. Every accepted outcome ends the task's claim: a claim batch with no task left running
-- leaves `claim_leases` and `batches`.
-- A task that ended (done or dead) with extras (see `extras`) lets its listeners go, and a
-- debounced one's payloads that came while it ran become its next window.
-- Returns one string, a letter per task in the order given: d(one) r(etry) x (dead) a(gain)
-- l (release) f (defer) s(tale).
-- Bound: the outcomes of one claim batch (at most a claim's size), each task's record, indexes and
--  logs.
local channel, shard, keep = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local out = {}
local earliest = nil
local uniques = redis.call('EXISTS', K_UNIQUE) == 1
local now_s = string.format('%d', now)
-- per claim token, a pattern matching a record running under it (its prefix before `fin` and
-- where its plugin starts captured): for a done outcome the fence and the rewrite are one match
local fence = {}
-- the ids, and for each the ARGV index of its run's first field
local ids, run_of = {}, {}
local logs_end = 4 + 2 * tonumber(ARGV[4])
local a = logs_end + 1
while a <= #ARGV do
  local count = tonumber(ARGV[a + 4])
  for j = a + 5, a + 4 + count do
    ids[#ids + 1] = ARGV[j]
    run_of[#ids] = a
  end
  a = a + 5 + count
end
local n = #ids
local letter = { done = 'd', retry = 'r', dead = 'x', again = 'a', release = 'l', defer = 'f' }
local recs = records_of(ids)
-- the done ones (the hot path) are written together, one variadic call per key
local released, records, dones, seen, ran, ended = {}, {}, {}, {}, {}, {}
local owned_ended = {}
-- the ended tasks whose records carry extras (an FS byte: only the extras mark is one)
local with_extras = {}
for i = 1, n do
  local h = run_of[i]
  local id, kind, token, value, err = ids[i], ARGV[h], ARGV[h + 1], tonumber(ARGV[h + 2]),
    ARGV[h + 3]
  local rec = recs[i]
  local verdict = 's'
  -- the fence: still running under this claim (a reaped or re-claimed task has moved on); an id
  -- named twice in one batch is recorded once, as if the second came after the first
  -- `at`: where the record's plugin field starts (a done one's, on the hot path)
  local held, done, at = false, nil, nil
  if not seen[id] and rec then
    local p = fence[token]
    if p == nil then
      -- (a token is digits; anything else can't be running, and is left to `holds`)
      p = string.match(token, '^%d+$') and '^r(\t%-?%d+\t%d+\t%d+\t%d+\t)' .. token .. '\t()' or false
      fence[token] = p
    end
    if kind == 'done' and p then
      -- hot path: flip the state and set the finish time without decoding the record
      local pre
      pre, at = string.match(rec, p)
      if pre then
        held = true
        done = 'd' .. pre .. now_s .. '\t' .. string.sub(rec, at)
      end
    else
      held = holds(rec, token)
    end
  end
  if held then
    seen[id] = true
    released[token] = (released[token] or 0) + 1
    local plugin = plugin_of(id, rec)
    ended[plugin] = (ended[plugin] or 0) + 1
    if kind == 'done' then
      push(records, id, done)
      dones[#dones + 1] = id
      -- its owner's pending count (`count_owned`), where it has an owner: on the hot path one
      -- byte tells (the owner field follows the plugin's), else the record is matched
      local who
      if at then
        local o = at + #plugin + 1
        if string.byte(rec, o) ~= 9 then who = plugin .. '\0' .. string.match(rec, '^[^\t]*', o) end
      else
        who = string.match(rec, '^r\t%-?%d+\t%d+\t%d+\t%d+\t%d*\t([^\t]*\t[^\t]+)\t')
        if who then who = string.gsub(who, '\t', '\0', 1) end
      end
      if who then owned_ended[who] = (owned_ended[who] or 0) + 1 end
      if uniques then start_unique_window(id, now) end
    else
      local t = parse(rec)
      if kind == 'retry' and t.att >= t.max then kind = 'dead' end
      if kind == 'dead' then
        bury(id, t, now, err)
        if uniques then start_unique_window(id, now) end
      else
        if kind == 'retry' then t.due = now + value; t.err = err
        elseif kind == 'again' then
          t.due = math.max(value, 0); t.att = 0; t.err = ''; t.created = string.format('%d', now)
        elseif kind == 'defer' then t.due = now + value; t.att = t.att - 1
        else t.att = t.att - 1 end -- release
        t.st = 's'; t.fin = ''
        redis.call('HSET', K_TASKS, id, encode(t))
        index_scheduled(id, t)
        if not earliest or t.due < earliest then earliest = t.due end
      end
    end
    verdict = letter[kind]
    if (kind == 'done' or kind == 'dead') and string.find(rec, '\28', 1, true) then
      with_extras[#with_extras + 1] = { id, rec, kind == 'done' }
    end
    if kind ~= 'release' and kind ~= 'defer' then ran[#ran + 1] = id end
  end
  out[#out + 1] = verdict
end
for j = 5, logs_end, 2 do
  if seen[ARGV[j]] then keep_log(ARGV[j], ARGV[j + 1]) end
end
release_batches(released)
for plugin, k in pairs(ended) do count_running(plugin, -k) end
for who, k in pairs(owned_ended) do count_owned(who, -k) end
if #ran > 0 and redis.call('EXISTS', K_RERUN) == 1 then call_many('HDEL', K_RERUN, ran) end
call_many('HSET', K_TASKS, records)
for _, e in ipairs(with_extras) do record_ended(e[1], parse(e[2]), now, e[3]) end
log_done(dones, now)
local any_done = #records > 0
if any_done then forget_done(now - keep) end
if uniques then redis.call('ZREMRANGEBYSCORE', K_UNIQUE, 0, now) end
if earliest then wake_if_head(channel, shard, earliest) end
return table.concat(out)
