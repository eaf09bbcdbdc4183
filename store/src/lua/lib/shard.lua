--! part shard
-- The keys every shard script takes first, all under the shard's hash tag {ns:s}, and the
-- helpers every one of them uses. Script-specific keys follow from KEYS[K_FIRST].
--   KEYS[1] tasks (HASH id -> record, see the `record` part)
--   KEYS[2] dead (ZSET id -> died at)
--   KEYS[3] byowner (ZSET, score 0, member owner \0 due(15 digits) \0 id)
--   KEYS[4] meta (HASH: 'claim' -> the shard's claim counter; 'paused' -> \0p1\0p2\0, the
--           plugins paused; 'layout' -> the data layout of the shard; 'bucket' -> the due
--           buckets' name counter; 'hd:' plugin -> a lower bound of the due times of the
--           plugin's scheduled tasks here, see `count_scheduled`; 'by:' plugin -> the bytes the
--           plugin's records here hold, see `weight`; 'op:' owner -> \0p1\0p2\0, the plugins
--           whose tasks of the owner are paused (`*`: all), and 'owners-paused' -> how many
--           owners are, see `owner_paused`; 'owner-heads' -> 1 once the owned tasks an
--           earlier build wrote have their owners' heads, see `owner_heads.lua`; 'po:' plugin
--           \0 owner -> how many of that owner's tasks of that plugin are scheduled, running or
--           dead here, see `count_owned`; 'rv-sweep' -> where the sweep of revocation requests
--           left behind goes on, see `ask_revoke`)
--   KEYS[5] parked (ZSET id -> due: scheduled tasks out of the buckets: those of a paused
--           plugin or owner, and those set aside for their plugin's fair share, also in `waiting`)
--   KEYS[6] byplugin (ZSET, score 0, member plugin \0 x \0 died-at(15) \0 id: each plugin's dead
--           tasks)
--   KEYS[7] unique (ZSET id -> -D while a task with unique_for_ms D is unfinished, the end of its
--           dedup window (ms) once it finished)
--   KEYS[8] rerun (HASH id -> 'created attempts first': a task put back because its claim's
--           lease expired at attempt `attempts` of its occurrence `created`; `first` is the claim
--           token of the first of the claims that ended so in a row. Its next claim commits
--           effects under `first`'s marker, so effects a dead runner committed before its outcome
--           was recorded are not committed again. Dropped when an outcome is recorded.)
--   KEYS[9] claim_leases (ZSET claim token -> lease end: one entry per claim batch still running)
--   KEYS[10] batches (HASH: token -> the claim's ids, tab-separated; token:n -> how many of them
--           still run under that claim; 'running' -> the sum of those counts; 'running:' plugin
--           -> the plugin's share of it; 'rv' \31 id -> a revocation asked of the runner holding
--           the task claimed ahead, see `revoke.lua`)
--   KEYS[11] finished (ZSET '<time>\t<id>\t<id>...' -> finish time: the tasks each finish script
--           recorded done, one entry per script run)
--   KEYS[12] scheduled (HASH plugin -> how many of its tasks are scheduled, in a bucket or
--           `parked`; a plugin with none has no field)
--   KEYS[13] duex (ZSET bucket name -> its bound: the index of the due buckets, see `buckets`)
--   KEYS[14] waiting (ZSET, score 0, member plugin \t due(15 digits) \t id: the due tasks a claim
--           set aside because their plugin had its share of the claiming runner; see `share`)
--   KEYS[15] logs (HASH id -> the log lines of the task's last attempts; see `logs`)
--   KEYS[16] outbox (ZSET message -> time: what this shard owes another one; see `extras`)
--   KEYS[17] listeners (HASH topic \31 key -> the tasks listening for it, \29-separated, each
--           then \30 task \30 stamp; see `extras`)
--   KEYS[18] events (HASH topic \31 key -> time \30 event JSON: the latest event of each topic and
--           key of this shard, kept for the lookback)
--   KEYS[19] event_times (ZSET topic \31 key -> the time of its latest event, to drop old ones)
local K_TASKS, K_DEAD, K_BYOWNER, K_META, K_PARKED
local K_BYPLUGIN, K_UNIQUE, K_RERUN, K_CLAIM_LEASES
local K_BATCHES, K_FINISHED, K_SCHEDULED, K_DUEX
local K_WAITING, K_LOGS
local K_OUTBOX, K_LISTENERS, K_EVENTS, K_EVENT_TIMES
local K_FIRST = 20

-- What a part keeps for one run only is set again by a function of this list at each run's start.
-- (The parts are loaded once as a Redis function library and run many times: the top level of a
-- part runs once, at load, so nothing it sets may depend on a run.)
local on_start = {}

-- Each run's start: its keys, then every part's state for one run.
local function start(keys)
  K_TASKS, K_DEAD, K_BYOWNER, K_META, K_PARKED = keys[1], keys[2], keys[3], keys[4], keys[5]
  K_BYPLUGIN, K_UNIQUE, K_RERUN, K_CLAIM_LEASES = keys[6], keys[7], keys[8], keys[9]
  K_BATCHES, K_FINISHED, K_SCHEDULED, K_DUEX = keys[10], keys[11], keys[12], keys[13]
  K_WAITING, K_LOGS = keys[14], keys[15]
  K_OUTBOX, K_LISTENERS, K_EVENTS, K_EVENT_TIMES = keys[16], keys[17], keys[18], keys[19]
  for i = 1, #on_start do on_start[i]() end
end

-- The latest time anything may be due (9999-12-31T23:59:59.999Z); the API keeps every time and
-- shift within bounds that leave it far below 2^53, so Lua's doubles hold them exactly.
local MAX_TIME = 253402300799999

-- Variadic commands take many members in one call (one command's overhead instead of one per
-- task); Lua's unpack has a stack limit, so long lists go in chunks of CHUNK values (even, so
-- score/member and field/value pairs never split).
local CHUNK = 4000

-- `cmd key ...list` (in chunks); nothing when the list is empty.
local function call_many(cmd, key, list, opt)
  local n = #list
  for i = 1, n, CHUNK do
    local j = math.min(i + CHUNK - 1, n)
    if opt then redis.call(cmd, key, opt, unpack(list, i, j))
    else redis.call(cmd, key, unpack(list, i, j)) end
  end
end

-- Appends a pair (score and member, field and value) to a list for `call_many`.
local function push(list, a, b)
  list[#list + 1] = a
  list[#list + 1] = b
end

-- The values of the fields `ids` of the hash `key` (false where there is none), in one HMGET
-- per chunk.
local function hmget(key, ids)
  local n = #ids
  if n <= CHUNK then
    if n == 0 then return {} end
    return redis.call('HMGET', key, unpack(ids))
  end
  local out = {}
  for i = 1, n, CHUNK do
    local part = redis.call('HMGET', key, unpack(ids, i, math.min(i + CHUNK - 1, n)))
    for _, r in ipairs(part) do out[#out + 1] = r end
  end
  return out
end

-- The records of `ids` (false where there is none).
local function records_of(ids)
  return hmget(K_TASKS, ids)
end

-- Redis's clock (ms), and the µs past that ms: one clock for every runner.
local function now_ms_us()
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), us % 1000
end
-- Redis's clock (ms).
local function now_ms()
  return (now_ms_us())
end
