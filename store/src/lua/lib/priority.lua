--! part priority
--! needs shard record buckets
-- Priority among due tasks. A task's priority 1-9 (0, the default, is not stored) is the `P`
-- entry of its extras (see `extras`). A scheduled task of priority > 0 in its due bucket is also
-- in the shard's priority index, `prio_key()` (ZSET, score 0, member <9 - priority, one digit>
-- <due(15 digits)> \0 <id>: the highest priority first, then the earliest due), so that a claim
-- takes the due tasks of the highest priority first (`prio_take`). Priority orders due tasks
-- only: a task is never taken before its due time. A task due for longer than the runner's aging
-- (`--priority-aging-ms`) counts as the highest: such tasks are taken before any other, in due
-- order, so none starves.
-- Every script that puts a task into its bucket or takes it out through `index_scheduled` and
-- `unindex_scheduled` (and `unpark`) keeps its entry; a claim drops the entries of the tasks it
-- takes. An entry whose task left its bucket another way (parked by a claim while its plugin or
-- owner is paused, set aside for its plugin's share) is dropped by the first claim that finds
-- it: an entry is taken only while its record is scheduled at the entry's due and the task is in
-- its bucket. A task put back from `parked` gets its entry again.

local function prio_key()
  return K_DUEX .. ':p'
end

-- The priority (0-9) of a record's last field (payload and marks; JSON holds no control
-- character, so the extras' marks are found by byte: a field without marks starts with its
-- payload, and is not walked). `at`: where the field starts in `last` (1 unless given).
local function priority_of(last, at)
  at = at or 1
  local b = string.byte(last, at)
  if b ~= 28 and b ~= 29 and b ~= 30 then return 0 end
  local s = string.find(last, '\28', at, true)
  if not s then return 0 end
  local e = string.find(last, '\28', s + 1, true)
  if not e then return 0 end
  return tonumber(string.match(string.sub(last, s, e), '[\28\31]P(%d)')) or 0
end

-- The priority of a stored record.
local function record_priority(rec)
  local at = string.match(rec, '^%a\t%-?%d+\t%d+\t%d+\t%d+\t%d*\t[^\t]*\t[^\t]*\t[^\t]*\t()')
  return at and priority_of(rec, at) or 0
end

local function prio_member(p, due, id)
  return string.char(57 - p) .. string.format('%015d', math.max(due, 0)) .. '\0' .. id
end

-- Adds the entry of a task of priority `p` going into its bucket to `list` (score, member
-- pairs), for `prio_add`.
local function prio_push(list, p, due, id)
  if p > 0 then push(list, '0', prio_member(p, due, id)) end
end

local function prio_add(list)
  call_many('ZADD', prio_key(), list)
end

local function prio_remove(p, due, id)
  if p > 0 then redis.call('ZREM', prio_key(), prio_member(p, due, id)) end
end

-- Whether the shard has tasks of priority > 0 in its buckets (a claim pays nothing else where
-- none has), read once per run: a claim asks when it takes tasks, in each owner's turn, and
-- when it writes what it took.
local prio_known
on_start[#on_start + 1] = function() prio_known = nil end
local function has_priorities()
  if prio_known == nil then prio_known = redis.call('EXISTS', prio_key()) == 1 end
  return prio_known
end

-- Takes up to `limit` due tasks at `now` out of the buckets into `ids` by priority, the highest
-- first (each level in due order), their entries dropped with any stale one walked.
local function prio_take(now, limit, ids)
  local key, upto = prio_key(), string.format('%015d', now + 1)
  local first = redis.call('ZRANGE', key, '0', '0')[1]
  local level = first and string.sub(first, 1, 1)
  -- (each round drops what it walked: at most one round per level, and one per `limit` of
  -- stale entries, which a bound of rounds keeps from holding Redis)
  for _ = 1, 20 do
    if not level or #ids >= limit then return end
    local want = limit - #ids
    local got = redis.call('ZRANGEBYLEX', key, '[' .. level, '(' .. level .. upto, 'LIMIT', '0',
      string.format('%d', want))
    local eids, edues = {}, {}
    for i, m in ipairs(got) do
      eids[i], edues[i] = string.sub(m, 18), tonumber(string.sub(m, 2, 16))
    end
    local recs = records_of(eids)
    for i, id in ipairs(eids) do
      local due = recs[i] and string.match(recs[i], '^s\t(%-?%d+)\t')
      if due and tonumber(due) == edues[i] and due_remove(id, edues[i]) == 1 then
        ids[#ids + 1] = id
        if taken_dues then taken_dues[id], taken_prios[id] = edues[i], got[i] end
      end
    end
    call_many('ZREM', key, got)
    if #got < want then
      -- the next level present (priorities run from '0', 9, to '8', 1)
      local b = string.byte(level)
      local nxt = redis.call('ZRANGEBYLEX', key, '[' .. string.char(b + 1), '+', 'LIMIT', '0', '1')[1]
      level = nxt and string.sub(nxt, 1, 1)
    end
  end
end

-- Takes up to `limit` due tasks at `now` out of the buckets, as `due_take` does, but by priority
-- where the shard has tasks of priority > 0: first those due `aging` ms ago or earlier, in due
-- order; then by priority; then in due order. Returns their ids, and the shard's earliest due
-- time after them when it was seen on the way (nil when not). `peek`: where the shard has no
-- priorities, leave them in their buckets (see `peeked`).
local function ordered_take(now, limit, aging, peek)
  if limit == 0 then return {}, nil end
  -- nothing due (an idle shard's claim): the one call `due_take` would make, and no more
  local first = first_due_bucket(now)
  if not first[1] then return {}, nil end
  if not has_priorities() then return due_take(now, limit, first, peek) end
  local ids = due_take(now - aging, limit)
  prio_take(now, limit, ids)
  if #ids >= limit then return ids, nil end
  local got, head = due_take(now, limit - #ids)
  for _, id in ipairs(got) do ids[#ids + 1] = id end
  return ids, head
end
