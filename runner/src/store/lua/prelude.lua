-- Shared by every eggtimer script (prepended at load time by store/scripts.rs).
-- Every shard script gets the same first sixteen KEYS, all under the shard's hash tag {ns:s}:
--   KEYS[1] due (ZSET id -> due ms: the scheduled tasks of layouts before 5, which keep them in
--           buckets, KEYS[16]; the migration empties it)
--   KEYS[2] tasks (HASH id -> record)
--   KEYS[3] inflight (ZSET id -> lease: the running tasks claimed by a runner of the layout
--           before claim batches; only read now, to reap them)
--   KEYS[4] dead (ZSET id -> died at)
--   KEYS[5] byowner (ZSET, score 0, member owner \0 due(15 digits) \0 id)
--   KEYS[6] meta (HASH: 'claim' -> the shard's claim counter; 'paused' -> \0p1\0p2\0, the
--           plugins paused; 'layout' -> the key layout this shard was migrated to)
--   KEYS[7] parked (ZSET id -> due: scheduled tasks of a paused plugin, out of `due`)
--   KEYS[8] byplugin (ZSET, score 0, member plugin \0 x \0 died-at(15) \0 id: the dead tasks of
--           each plugin. Layouts before 4 also listed scheduled tasks here, as plugin \0 s \0
--           due(15) \0 id; the migration turns those into counts in `scheduled`.)
--   KEYS[9] unique (ZSET id -> -D while a task with unique_for_ms D is unfinished, the end of
--           its dedup window (ms) once it finished)
--   KEYS[10] recent (ZSET id -> finish time: the done records in `tasks` finished before the
--           `finished` log; no script adds to it now, `forget_done` drains it)
--   KEYS[11] rerun (HASH id -> 'created attempts first': a task put back because its lease
--           expired at attempt `attempts` of its occurrence `created`; `first` is the claim token
--           of the first of the claims that ended so in a row. Its next claim commits effects
--           under `first`'s marker, so effects a dead runner committed before its outcome was
--           recorded are not committed again. Dropped when an outcome is recorded.)
--   KEYS[12] leases (ZSET claim token -> lease end: one entry per claim batch still running)
--   KEYS[13] batches (HASH: token -> the claim's ids, tab-separated; token:n -> how many of
--           them still run under that claim; 'running' -> the sum of those counts)
--   KEYS[14] finished (ZSET '<time>\t<id>\t<id>...' -> finish time: the tasks each finish script
--           recorded done, one entry per script run (readers skip the first field: earlier
--           builds wrote a counter, meta's 'finished', there). An id
--           listed is done at that time only while its record says so (done, `fin` that time).
--           Done records written before this layout are in `recent` instead.)
--   KEYS[15] scheduled (HASH plugin -> how many of its tasks are scheduled, in `due` or
--           `parked`; a plugin with none has no field)
--   KEYS[16] duex (ZSET bucket name -> its bound: the index of the due buckets, see below)
--   A claim batch leaves `leases` and `batches` when its last task's outcome is recorded, or
--   when its lease ends (the reaper puts back the tasks still running under it).
-- Script-specific keys follow from KEYS[K_FIRST].
-- A record is ten tab-separated fields, the payload last (it may hold anything):
--   state(s|r|d|x) due attempts max_attempts created fin plugin owner last_error payload
-- `fin` is the finish time (ms) of a done or dead task, the claim token of a running one (the
-- fence: finish, renew and effects must name it), and empty for a scheduled one. Records written
-- before claim tokens existed have an empty `fin` while running: no runner holds such a claim, so
-- they are recovered by lease expiry.
local K_DUE, K_TASKS, K_INFLIGHT, K_DEAD, K_BYOWNER, K_META = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6]
local K_PARKED, K_BYPLUGIN, K_UNIQUE, K_RECENT, K_RERUN = KEYS[7], KEYS[8], KEYS[9], KEYS[10],
  KEYS[11]
local K_LEASES, K_BATCHES, K_FINISHED, K_SCHEDULED = KEYS[12], KEYS[13], KEYS[14], KEYS[15]
local K_DUEX = KEYS[16]
local K_FIRST = 17

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

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function parse(rec)
  if not rec then return nil end
  local st, due, att, max, cr, fin, plugin, owner, err, payload = string.match(rec,
    '^(%a)\t(%-?%d+)\t(%d+)\t(%d+)\t(%d+)\t(%d*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$')
  if not st then return nil end
  return { st = st, due = tonumber(due), att = tonumber(att), max = tonumber(max), created = cr,
    fin = fin, plugin = plugin, owner = owner, err = err, payload = payload }
end

local function encode(t)
  return table.concat({ t.st, string.format('%d', t.due), string.format('%d', t.att),
    string.format('%d', t.max), t.created, t.fin, t.plugin, t.owner, t.err, t.payload }, '\t')
end

local function owner_member(owner, due, id)
  return owner .. '\0' .. string.format('%015d', due) .. '\0' .. id
end

-- kind 'x' (dead, score = died at); 's' (scheduled, score = due) only in layouts before 4.
local function plugin_member(plugin, kind, score, id)
  return plugin .. '\0' .. kind .. '\0' .. string.format('%015d', score) .. '\0' .. id
end

-- `n` more (or fewer, n < 0) scheduled tasks of `plugin`; a plugin at zero leaves the hash.
local function count_scheduled(plugin, n)
  if redis.call('HINCRBY', K_SCHEDULED, plugin, string.format('%d', n)) <= 0 then
    redis.call('HDEL', K_SCHEDULED, plugin)
  end
end

-- The plugins paused in this shard (read once per script run; the answer kept per plugin).
local paused_list, paused_of = nil, {}
local function is_paused(plugin)
  local p = paused_of[plugin]
  if p == nil then
    if paused_list == nil then paused_list = redis.call('HGET', K_META, 'paused') or '' end
    p = string.find(paused_list, '\0' .. plugin .. '\0', 1, true) ~= nil
    paused_of[plugin] = p
  end
  return p
end

-- The due buckets (layout 5). A scheduled task's due time is an entry in one small ZSET, its
-- bucket, instead of in one ZSET per shard: Redis keeps a ZSET of at most
-- zset-max-listpack-entries (128 by default) short members as a listpack, ~20 bytes per entry
-- against ~110 in a large ZSET's skiplist and dict (BENCHMARKS.md, twelfth round).
--   K_DUEX: bucket name -> its bound (ms). Bucket `name` is the ZSET K_DUEX .. ':' .. name of id
--   -> due − bound, and holds exactly the tasks due from its bound up to (not including) the next
--   bucket's bound. (Offsets from the bound are small numbers, which a listpack keeps in 1 to 4
--   bytes instead of 8.) A task earlier than every bucket starts a bucket of its own. Bounds
--   are distinct; names come from meta's 'bucket' counter.
--   A bucket that would pass BUCKET_MAX is cut into buckets of about BUCKET_FILL (between equal
--   due times, so a run of tasks due at one instant stays in one bucket, however large: a
--   bucket already past BUCKET_MAX just grows). An emptied bucket leaves the index at once.
--   An entry's due is its record's due, so a task's bucket is found from its record.
-- The bucket keys are not in KEYS: they share the shard's hash tag, so a script touches one
-- slot all the same.
local BUCKET_MAX, BUCKET_FILL = 128, 64

local function bucket_key(name)
  return K_DUEX .. ':' .. name
end

local function new_bucket(bound)
  local name = string.format('%d', redis.call('HINCRBY', K_META, 'bucket', '1'))
  redis.call('ZADD', K_DUEX, string.format('%d', bound), name)
  return name
end

-- A range limit of due times ('-inf', '+inf' or ms, '(' before it when exclusive) as one of the
-- offsets in a bucket of bound `bound`.
local function offset_arg(s, bound)
  local open = ''
  if string.sub(s, 1, 1) == '(' then open, s = '(', string.sub(s, 2) end
  if s == '-inf' or s == '+inf' then return open .. s end
  return open .. string.format('%d', tonumber(s) - bound)
end

-- ZADDs the pairs list[from..to] (due, id: pair i at 2i-1, 2i, in due order; num[i] the due) to
-- the bucket `key` of bound `bound`, the latest first. (A listpack ZSET finds an element's
-- place by a scan from its start, and checks the member is new by a scan of all of it: the
-- latest first puts each at the front, half the work of filling a bucket.) Returns how many
-- ids were new.
local function add_latest_first(key, bound, list, num, from, to)
  local back, d, offset = {}, nil, nil
  for i = to, from, -1 do
    -- (formatted once per due time: tasks due at one instant share it)
    if num[i] ~= d then d, offset = num[i], string.format('%d', num[i] - bound) end
    push(back, offset, list[2 * i])
  end
  local added, n = 0, #back
  for i = 1, n, CHUNK do
    added = added + redis.call('ZADD', key, unpack(back, i, math.min(i + CHUNK - 1, n)))
  end
  return added
end

-- Cuts the pairs `list` (due, id), in due order with `num` their due times, into buckets of
-- about BUCKET_FILL, never between two equal due times; the first goes into the (empty) bucket
-- `name` of bound `bound` if one is given, each other starts a bucket at its first due time.
local function cut_into_buckets(list, num, name, bound)
  local from, total = 1, #num
  while from <= total do
    local to = math.min(from + BUCKET_FILL - 1, total)
    if total - to < BUCKET_FILL / 2 then to = total end -- no small bucket at the end
    while to < total and num[to + 1] == num[to] do to = to + 1 end
    local pname, pbound = name, bound
    if from > 1 or not name then pname, pbound = new_bucket(num[from]), num[from] end
    add_latest_first(bucket_key(pname), pbound, list, num, from, to)
    from = to + 1
  end
end

-- Adds the pairs `group` (due, id, in due order; `num` the due times) to the bucket `name` of
-- bound `bound`, all of whose range they fall in, without letting it pass BUCKET_MAX. Returns
-- how many ids were new.
local function fill_bucket(name, bound, group, num)
  local key = bucket_key(name)
  local card, n = redis.call('ZCARD', key), #num
  if card > BUCKET_MAX or card + n <= BUCKET_MAX then
    -- (past a listpack already, a run due at one instant: as one large ZSET, in any order)
    return add_latest_first(key, bound, group, num, 1, n)
  end
  -- all later than the bucket's last task (tasks scheduled as time goes on): new buckets after
  -- it, which is left as it is
  local last = tonumber(redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
  if last and num[1] > bound + last then
    cut_into_buckets(group, num, nil, nil)
    return n
  end
  -- else its tasks and the new ones, in due order (an id already in it takes its new due), cut
  local have = redis.call('ZRANGE', key, '0', '-1', 'WITHSCORES')
  local all, at, added = {}, {}, 0
  for i = 1, #have, 2 do
    all[#all + 1] = { bound + tonumber(have[i + 1]), have[i] }
    at[have[i]] = #all
  end
  for i = 1, n do
    local x = { num[i], group[2 * i] }
    if at[x[2]] then
      all[at[x[2]]] = x
    else
      all[#all + 1] = x
      at[x[2]] = #all
      added = added + 1
    end
  end
  table.sort(all, function(a, b) return a[1] < b[1] end)
  redis.call('DEL', key)
  local list, nums = {}, {}
  for i, x in ipairs(all) do
    push(list, '', x[2])
    nums[i] = x[1]
  end
  cut_into_buckets(list, nums, name, bound)
  return added
end

-- Adds the pairs `list` (due, id) to the buckets. Returns how many ids were new. (The callers
-- add only tasks not in a bucket: a task moves by leaving its bucket first.)
local function due_add(list)
  local n = #list / 2
  if n == 0 then return 0 end
  local num, sorted = {}, true
  for i = 1, n do
    local d
    -- (Lua strings are interned: the same due as the last is one comparison, not a parse)
    if i > 1 and list[2 * i - 1] == list[2 * i - 3] then d = num[i - 1]
    else d = tonumber(list[2 * i - 1]) end
    num[i] = d
    if i > 1 and d < num[i - 1] then sorted = false end
  end
  if not sorted then -- (tasks mostly come in due order, or due at one instant: no sort then)
    local order, by_due, nums = {}, {}, {}
    for i = 1, n do order[i] = i end
    table.sort(order, function(a, b) return num[a] < num[b] end)
    for j, i in ipairs(order) do
      push(by_due, list[2 * i - 1], list[2 * i])
      nums[j] = num[i]
    end
    list, num = by_due, nums
  end
  local added, i = 0, 1
  while i <= n do
    local d = string.format('%d', num[i])
    local b = redis.call('ZREVRANGEBYSCORE', K_DUEX, d, '-inf', 'WITHSCORES', 'LIMIT', '0', '1')
    local name, bound = b[1], tonumber(b[2])
    local next_bound
    if name then
      next_bound = tonumber(redis.call('ZRANGEBYSCORE', K_DUEX, '(' .. b[2], '+inf',
        'WITHSCORES', 'LIMIT', '0', '1')[2])
    else
      -- earlier than every bucket: a bucket of its own, up to the first one
      next_bound = tonumber(redis.call('ZRANGE', K_DUEX, '0', '0', 'WITHSCORES')[2])
      name, bound = new_bucket(num[i]), num[i]
    end
    local group, nums
    if i == 1 and (not next_bound or num[n] < next_bound) then
      group, nums, i = list, num, n + 1 -- all in this bucket (as W0's tasks, due at one instant)
    else
      group, nums = {}, {}
      while i <= n and (not next_bound or num[i] < next_bound) do
        push(group, list[2 * i - 1], list[2 * i])
        nums[#nums + 1] = num[i]
        i = i + 1
      end
    end
    added = added + fill_bucket(name, bound, group, nums)
  end
  return added
end

-- Takes `id` (due at `due`, a number) out of its bucket. Returns 1 if it was there, else 0.
local function due_remove(id, due)
  local name = redis.call('ZREVRANGEBYSCORE', K_DUEX, string.format('%d', due), '-inf',
    'LIMIT', '0', '1')[1]
  if not name then return 0 end
  local key = bucket_key(name)
  if redis.call('ZREM', key, id) == 0 then return 0 end
  if redis.call('EXISTS', key) == 0 then redis.call('ZREM', K_DUEX, name) end
  return 1
end

-- Takes up to `limit` tasks due at `now` (a number) or before out of the buckets, the earliest
-- first. Returns their ids, and the shard's earliest due time after them when it was seen on
-- the way (nil when not).
local function due_take(now, limit)
  local ids = {}
  while #ids < limit do
    local b = redis.call('ZRANGEBYSCORE', K_DUEX, '-inf', string.format('%d', now), 'WITHSCORES',
      'LIMIT', '0', '1')
    if not b[1] then return ids, nil end
    local key, bound = bucket_key(b[1]), tonumber(b[2])
    local got = redis.call('ZRANGEBYSCORE', key, '-inf', string.format('%d', now - bound),
      'LIMIT', '0', string.format('%d', limit - #ids))
    -- the walk started at the bucket's lowest score: the ids are its first ranks
    if #got > 0 then redis.call('ZREMRANGEBYRANK', key, '0', string.format('%d', #got - 1)) end
    for _, id in ipairs(got) do ids[#ids + 1] = id end
    local head = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')[2]
    -- what is left of the first bucket is the shard's earliest (every other bucket is later)
    if head then return ids, bound + tonumber(head) end
    redis.call('ZREM', K_DUEX, b[1])
  end
  return ids, nil
end

-- The earliest due time of the shard, or -1 when nothing is scheduled.
local function head_due()
  local b = redis.call('ZRANGE', K_DUEX, '0', '0', 'WITHSCORES')
  if not b[1] then return -1 end
  local head = redis.call('ZRANGE', bucket_key(b[1]), '0', '0', 'WITHSCORES')[2]
  if not head then return -1 end
  return tonumber(b[2]) + tonumber(head)
end

-- Puts a scheduled task into its due bucket (or `parked` while its plugin is paused) and the owner index,
-- and counts it for its plugin (the record is written by the caller).
local function index_scheduled(id, t)
  local added
  if is_paused(t.plugin) then
    added = redis.call('ZADD', K_PARKED, t.due, id)
  else
    added = due_add({ string.format('%d', t.due), id })
  end
  if t.owner ~= '' then redis.call('ZADD', K_BYOWNER, 0, owner_member(t.owner, t.due, id)) end
  if added > 0 then count_scheduled(t.plugin, 1) end
end

local function unindex_scheduled(id, t)
  -- (and out of the flat `due` of layouts before 5, which is empty once a shard is migrated)
  local removed = due_remove(id, t.due) + redis.call('ZREM', K_PARKED, id)
    + redis.call('ZREM', K_DUE, id)
  if t.owner ~= '' then redis.call('ZREM', K_BYOWNER, owner_member(t.owner, t.due, id)) end
  if removed > 0 then count_scheduled(t.plugin, -1) end
end

-- When a dead task died (its `fin`; records without one sort first).
local function died_at(t)
  return tonumber(t.fin) or 0
end

-- Dead-letters a task (any state but scheduled, whose indexes the caller has left).
local function bury(id, t, now, err)
  t.st = 'x'; t.fin = string.format('%d', now); t.err = err
  redis.call('HSET', K_TASKS, id, encode(t))
  redis.call('ZADD', K_DEAD, now, id)
  redis.call('ZADD', K_BYPLUGIN, 0, plugin_member(t.plugin, 'x', now, id))
end

local function unindex_dead(id, t)
  redis.call('ZREM', K_DEAD, id)
  redis.call('ZREM', K_BYPLUGIN, plugin_member(t.plugin, 'x', died_at(t), id))
end

-- A task finished (done or dead): a dedup window it asked for starts now.
local function start_unique_window(id, now)
  local u = tonumber(redis.call('ZSCORE', K_UNIQUE, id))
  if u and u < 0 then redis.call('ZADD', K_UNIQUE, now - u, id) end
end

-- Whether `id` is inside a dedup window (expired windows are dropped on the way).
local function in_unique_window(id, now)
  local u = tonumber(redis.call('ZSCORE', K_UNIQUE, id))
  if not u or u < 0 then return false end
  if u > now then return true end
  redis.call('ZREM', K_UNIQUE, id)
  return false
end

-- A chunked walk's answer: the count, and where the next chunk starts ('' when this chunk did
-- not fill up, so the walk is over).
local function chunk_done(count, members, limit)
  if #members == limit then return { count, members[#members] } end
  return { count, '' }
end

-- The number of members of the ZSET `key` ordered before the place (score `s`, member `m`), in
-- O(log n): binary search by rank among the members of score `s`, never a walk from the start.
-- `s` is passed to Redis as the caller's string (Lua would print a large number in exponent form).
local function rank_of(key, s, m)
  local lo = redis.call('ZCOUNT', key, '-inf', '(' .. s)
  local hi = redis.call('ZCOUNT', key, '-inf', s)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local at = redis.call('ZRANGE', key, mid, mid)[1]
    if at < m then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- Wakes the shard's pollers (on every runner) when `due` became the shard's earliest time.
local function wake_if_head(channel, shard, due)
  if channel ~= '' and head_due() == due then
    redis.call('PUBLISH', channel, shard .. ':' .. string.format('%d', due))
  end
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

-- The state and `fin` field of a stored record, without decoding the rest.
local function state_and_fin(rec)
  if not rec then return nil, nil end
  return string.match(rec, '^(%a)\t%-?%d+\t%d+\t%d+\t%d+\t(%d*)\t')
end

-- Whether `rec` is running under the claim `token`.
local function holds(rec, token)
  local st, fin = state_and_fin(rec)
  return st == 'r' and fin == token
end

-- A running task `t` whose lease ended goes back to due at `now`, or is dead-lettered when that
-- attempt was its last.
local function reap(id, t, now)
  t.err = 'lease expired during attempt ' .. t.att .. ' (its runner died or stalled)'
  if t.att >= t.max then
    bury(id, t, now, t.err)
    start_unique_window(id, now)
    redis.call('HDEL', K_RERUN, id)
  else
    if t.fin ~= '' then note_rerun(id, t) end
    t.st = 's'; t.due = now; t.fin = ''
    redis.call('HSET', K_TASKS, id, encode(t))
    index_scheduled(id, t)
  end
end

-- Puts back the tasks whose lease ended (their runner died or stalled): whole claim batches,
-- the earliest first, until `limit` ids were looked at (so one script does at most `limit` plus
-- one batch of work), and up to `limit` claimed under the earlier per-task layout (`inflight`).
local function reap_expired(now, limit)
  local ids = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', now - 1, 'LIMIT', 0, limit)
  for _, id in ipairs(ids) do
    redis.call('ZREM', K_INFLIGHT, id)
    local t = parse(redis.call('HGET', K_TASKS, id))
    if t and t.st == 'r' then reap(id, t, now) end
  end
  local seen = 0
  while seen < limit do
    local token = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now - 1, 'LIMIT', 0, 1)[1]
    if not token then break end
    local b = redis.call('HMGET', K_BATCHES, token, token .. ':n')
    redis.call('ZREM', K_LEASES, token)
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

-- The lowest score of the ZSET `key` (nil when it is empty).
local function first_score(key)
  return tonumber(redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')[2])
end

-- The earlier of two times, either of them nil (-1 when both are).
local function min_time(a, b)
  if a and b then return math.min(a, b) end
  return a or b or -1
end

-- When the first lease of the shard ends (-1: nothing runs).
local function next_lease_end()
  return min_time(first_score(K_LEASES), first_score(K_INFLIGHT))
end

-- Claims `ids` (claimed under `token`, lease ending at `expires`) as one batch.
local function lease_batch(token, ids, expires)
  if #ids == 0 then return end
  local n = string.format('%d', #ids)
  redis.call('HSET', K_BATCHES, token, table.concat(ids, '\t'), token .. ':n', n)
  redis.call('HINCRBY', K_BATCHES, 'running', n)
  redis.call('ZADD', K_LEASES, expires, token)
end

-- Outcomes were recorded for tasks claimed under the tokens `done` counts (token -> how many):
-- a batch none of whose tasks still runs leaves `leases` and `batches`.
local function release_batches(done)
  local total = 0
  for token, k in pairs(done) do
    total = total + k
    if redis.call('HINCRBY', K_BATCHES, token .. ':n', string.format('%d', -k)) <= 0 then
      redis.call('HDEL', K_BATCHES, token, token .. ':n')
      redis.call('ZREM', K_LEASES, token)
    end
  end
  if total > 0 then
    redis.call('HINCRBY', K_BATCHES, 'running', string.format('%d', -total))
  end
end

-- Deletes done records that finished before `before` (the retention window): up to `limit` of
-- the earlier layout's `recent`, and the tasks of up to two `finished` entries (so each finish
-- script, adding one, removes at least as many as it adds). The walks start at the lowest
-- scores, so the entries read are the first ranks.
local function forget_done(before, limit)
  local cut = '(' .. string.format('%d', before)
  local ids = redis.call('ZRANGEBYSCORE', K_RECENT, '-inf', cut, 'LIMIT', '0',
    string.format('%d', limit))
  if #ids > 0 then
    local recs, gone = records_of(ids), {}
    for i, id in ipairs(ids) do
      local rec = recs[i]
      if rec and string.sub(rec, 1, 1) == 'd' then gone[#gone + 1] = id end
    end
    call_many('HDEL', K_TASKS, gone)
    redis.call('ZREMRANGEBYRANK', K_RECENT, 0, #ids - 1)
  end
  local logs = redis.call('ZRANGEBYSCORE', K_FINISHED, '-inf', cut, 'LIMIT', '0', '2')
  if #logs == 0 then return end
  ids = {}
  for _, entry in ipairs(logs) do
    for id in string.gmatch(string.match(entry, '^[^\t]*\t(.*)$') or '', '[^\t]+') do
      ids[#ids + 1] = id
    end
  end
  local recs, gone = records_of(ids), {}
  for i, id in ipairs(ids) do
    -- still done, and then (not run again since and done later, nor replaced)
    local st, fin = state_and_fin(recs[i])
    if st == 'd' and (tonumber(fin) or 0) < before then gone[#gone + 1] = id end
  end
  call_many('HDEL', K_TASKS, gone)
  redis.call('ZREMRANGEBYRANK', K_FINISHED, 0, #logs - 1)
end

-- Logs `ids` as recorded done at `now` by this script: one `finished` entry. (Its first field is
-- the time, which every reader skips; earlier builds put meta's 'finished' counter there, one
-- more call per finish. Two runs in the same ms that recorded the same ids in the same order
-- make one entry, which lists them done at that time all the same.)
local function log_done(ids, now)
  if #ids == 0 then return end
  local at = string.format('%d', now)
  redis.call('ZADD', K_FINISHED, at, at .. '\t' .. table.concat(ids, '\t'))
end
