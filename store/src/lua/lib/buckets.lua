--! part buckets
--! needs shard
-- The due buckets. A scheduled task's due time is an entry in one small ZSET, its
-- bucket, instead of in one ZSET per shard: Redis keeps a ZSET of at most
-- zset-max-listpack-entries (128 by default) short members as a listpack, ~20 bytes per entry
-- against ~110 in a large ZSET's skiplist and dict (BENCHMARKS.md).
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

-- The first bucket whose bound is at or before `now` (a number): {name, bound}, or {} when
-- nothing is due.
local function first_due_bucket(now)
  return redis.call('ZRANGEBYSCORE', K_DUEX, '-inf', string.format('%d', now), 'WITHSCORES',
    'LIMIT', '0', '1')
end

-- What this run noted of the tasks it took out of the buckets, when it asked (`note_takes`): a
-- claim puts back or sets aside what it took and did not read by these, without reading its
-- record. `taken_dues`: id -> due (ms); `taken_prios`: id -> its entry in the priority index,
-- when the take dropped it (`prio_take`); `taken_owners`: id -> `plugin \0 owner`, when an
-- owner's turn took it (`owner_turn`); `turns_taken`: whether an owner's turn moved a head.
local taken_dues, taken_prios, taken_owners, turns_taken
on_start[#on_start + 1] = function()
  taken_dues, taken_prios, taken_owners, turns_taken = nil, nil, nil, false
end
local function note_takes()
  taken_dues, taken_prios, taken_owners = {}, {}, {}
end

-- A take that leaves what it takes in the buckets (`peeked`: each bucket's name, bound, how many
-- of its first ranks were taken, and whether it holds more) until the claim knows how many of
-- them it keeps (`peeked_drop`): what it does not keep stays, unread and unmoved, at no cost.
-- Only where nothing else takes from the buckets in the same run (no priorities, no owners'
-- turns), so the first ranks of each bucket are still what was taken. (The hot path: no scores
-- asked.)
local peeked
on_start[#on_start + 1] = function() peeked = nil end

-- Drops the first `n` tasks a peeking take took out of their buckets, and the buckets it
-- emptied out of the index.
local function peeked_drop(n)
  for _, s in ipairs(peeked) do
    if n <= 0 then return end
    local k, key = math.min(n, s[3]), bucket_key(s[1])
    if k > 0 then redis.call('ZREMRANGEBYRANK', key, '0', string.format('%d', k - 1)) end
    if k == s[3] and not s[4] then redis.call('ZREM', K_DUEX, s[1]) end
    n = n - k
  end
end

-- The due times of the tasks a peeking take took, noted (`taken_dues`) as a noting take notes
-- them: one read of each bucket's first ranks with their scores.
local function peeked_dues()
  for _, s in ipairs(peeked) do
    if s[3] > 0 then
      local got = redis.call('ZRANGE', bucket_key(s[1]), '0', string.format('%d', s[3] - 1),
        'WITHSCORES')
      for i = 1, #got, 2 do taken_dues[got[i]] = s[2] + tonumber(got[i + 1]) end
    end
  end
end

-- Takes up to `limit` tasks due at `now` (a number) or before out of the buckets, the earliest
-- first. Returns their ids, and the shard's earliest due time after them when it was seen on
-- the way (nil when not). `first`: what `first_due_bucket(now)` answered just before, if the
-- caller asked it. `peek`: leave them in their buckets (see `peeked`).
local function due_take(now, limit, first, peek)
  local ids = {}
  if peek then
    peeked = {}
    for at = 0, math.huge do
      if #ids >= limit then return ids, nil end
      local b = first or redis.call('ZRANGEBYSCORE', K_DUEX, '-inf', string.format('%d', now),
        'WITHSCORES', 'LIMIT', string.format('%d', at), '1')
      first = nil
      if not b[1] then return ids, nil end
      local key, bound = bucket_key(b[1]), tonumber(b[2])
      local got = redis.call('ZRANGEBYSCORE', key, '-inf', string.format('%d', now - bound),
        'LIMIT', '0', string.format('%d', limit - #ids))
      for _, id in ipairs(got) do ids[#ids + 1] = id end
      local n = string.format('%d', #got)
      local head = redis.call('ZRANGE', key, n, n, 'WITHSCORES')[2]
      peeked[#peeked + 1] = { b[1], bound, #got, head ~= nil }
      if head then return ids, bound + tonumber(head) end
    end
  end
  while #ids < limit do
    local b = first or first_due_bucket(now)
    first = nil
    if not b[1] then return ids, nil end
    local key, bound = bucket_key(b[1]), tonumber(b[2])
    local upto, n = string.format('%d', now - bound), string.format('%d', limit - #ids)
    local got
    if taken_dues then
      local pairs_ = redis.call('ZRANGEBYSCORE', key, '-inf', upto, 'WITHSCORES', 'LIMIT', '0', n)
      got = {}
      for i = 1, #pairs_, 2 do
        got[#got + 1] = pairs_[i]
        taken_dues[pairs_[i]] = bound + tonumber(pairs_[i + 1])
      end
    else
      got = redis.call('ZRANGEBYSCORE', key, '-inf', upto, 'LIMIT', '0', n)
    end
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

-- Wakes the shard's pollers (on every runner) when `due` became the shard's earliest time.
local function wake_if_head(channel, shard, due)
  if channel ~= '' and head_due() == due then
    redis.call('PUBLISH', channel, shard .. ':' .. string.format('%d', due))
  end
end
