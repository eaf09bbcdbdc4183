--! part indexes
--! needs shard record buckets priority
-- Where a task is listed in each state, kept in step with its record by every script: scheduled
-- in a due bucket (or `parked` while its plugin or owner is paused or it waits for its plugin's share, see
-- `share`), the owner index and the plugin's
-- count; dead in `dead` and `byplugin`; a dedup window in `unique`.

-- `n` more (or fewer, n < 0) scheduled tasks of `plugin`; a plugin at zero leaves the hash.
-- Added tasks (n > 0) name the earliest due among them: the plugin's head in `meta`
-- ('hd:' .. plugin) is a lower bound of its scheduled tasks' due times (exact when it had none;
-- lowered, never raised, while it has some; gone with its last one). A plugin with tasks and no
-- head (written before heads were kept) may have any task due. A claim walks past its size for
-- other plugins only when one whose head has come has tasks here (see `claim`).
local function count_scheduled(plugin, n, due)
  local left = redis.call('HINCRBY', K_SCHEDULED, plugin, string.format('%d', n))
  if left <= 0 then
    redis.call('HDEL', K_SCHEDULED, plugin)
    redis.call('HDEL', K_META, 'hd:' .. plugin)
  elseif due then
    local head = left == n and math.huge or tonumber(redis.call('HGET', K_META, 'hd:' .. plugin))
    if head and due < head then
      redis.call('HSET', K_META, 'hd:' .. plugin, string.format('%d', due))
    end
  end
end

-- An owner's pending tasks of a plugin here: its records scheduled, running or dead, meta's
-- 'po:' plugin \0 owner (`max_pending_per_owner` sums it over the shards). A record counts from
-- its creation to its end (done, deleted, replaced); moving between those three states leaves
-- the count alone. `n` more (fewer, n < 0) of `who` (plugin \0 owner); at zero the field goes.
-- (Records an earlier build wrote were never counted: their end takes one off another's count,
-- never below zero, so an owner's count may be short by what 0.2.0 left it.)
local function count_owned(who, n)
  local f = 'po:' .. who
  if redis.call('HINCRBY', K_META, f, string.format('%d', n)) <= 0 then redis.call('HDEL', K_META, f) end
end

-- `count_owned` for record `t` (parsed) when it has an owner and a pending state.
local function count_owned_record(t, n)
  if t.owner ~= '' and (t.st == 's' or t.st == 'r' or t.st == 'x') then
    count_owned(t.plugin .. '\0' .. t.owner, n)
  end
end

-- The plugins paused in this shard (meta's 'paused': \0p1\0p2\0, read once per script run; the
-- answer kept per plugin).
local paused_list, paused_of
-- The owners paused in this shard: meta's 'op:' .. owner is \0p1\0p2\0, the plugins whose tasks
-- of the owner are paused (`*`: all of them), and 'owners-paused' how many owners have such a
-- field (read once per script run; each owner's field once per run, where any owner is paused).
local owners_paused, owner_pauses
on_start[#on_start + 1] = function()
  paused_list, paused_of, owners_paused, owner_pauses = nil, {}, nil, {}
end
local function is_paused(plugin)
  local p = paused_of[plugin]
  if p == nil then
    if paused_list == nil then paused_list = redis.call('HGET', K_META, 'paused') or '' end
    p = string.find(paused_list, '\0' .. plugin .. '\0', 1, true) ~= nil
    paused_of[plugin] = p
  end
  return p
end

-- Whether any owner is paused here.
local function owners_marked()
  if owners_paused == nil then
    owners_paused = (tonumber(redis.call('HGET', K_META, 'owners-paused')) or 0) > 0
  end
  return owners_paused
end

-- Whether an owner is paused here, for all its tasks or for `plugin`'s.
local function owner_paused(owner, plugin)
  if owner == '' or not owners_marked() then return false end
  local list = owner_pauses[owner]
  if list == nil then
    list = redis.call('HGET', K_META, 'op:' .. owner) or ''
    owner_pauses[owner] = list
  end
  return list ~= '' and (string.find(list, '\0*\0', 1, true) ~= nil
    or string.find(list, '\0' .. plugin .. '\0', 1, true) ~= nil)
end

-- Whether a scheduled task of `plugin` and `owner` waits in `parked` instead of its due bucket:
-- its plugin or its owner is paused.
local function is_held(plugin, owner)
  return is_paused(plugin) or owner_paused(owner, plugin)
end

-- The owners' heads: ZSET plugin \0 owner -> a lower bound of the due times of that owner's
-- tasks of that plugin in the due buckets (lowered as tasks go in; raised or dropped only by a
-- claim that looked, see `fair_take`). Beside the owner index, under the shard's hash tag.
local function owner_heads()
  return K_BYOWNER .. ':due'
end

-- The owners' heads of tasks put into the due buckets: `list` pairs (due, plugin \0 owner) for
-- one ZADD LT (the lowest of each pair kept).
local function lower_owner_heads(list)
  call_many('ZADD', owner_heads(), list, 'LT')
end

-- Puts parked tasks back into their due buckets, due as they were: those of `ids` (records
-- `recs`) still scheduled for which `resumes(id, t)` says so. A task set aside for its plugin's
-- share before a pause leaves `waiting` too. Wakes the shard's pollers (`channel`, `shard`) when
-- one of them became its earliest. Returns how many it put back.
local function unpark(channel, shard, ids, recs, resumes)
  local resumed, back, waited, heads, prios, earliest = {}, {}, {}, {}, {}, nil
  for i, id in ipairs(ids) do
    local t = parse(recs[i])
    if t and t.st == 's' and resumes(id, t) then
      resumed[#resumed + 1] = id
      prio_push(prios, priority_of(t.payload), t.due, id)
      if t.owner ~= '' then push(heads, string.format('%d', t.due), t.plugin .. '\0' .. t.owner) end
      waited[#waited + 1] = wait_member(t.plugin, t.due, id)
      push(back, t.due, id)
      if not earliest or t.due < earliest then earliest = t.due end
    end
  end
  call_many('ZREM', K_PARKED, resumed)
  call_many('ZREM', K_WAITING, waited)
  due_add(back)
  prio_add(prios)
  lower_owner_heads(heads)
  if earliest then wake_if_head(channel, shard, earliest) end
  return #resumed
end

-- Puts a scheduled task into its due bucket (or `parked` while its plugin or owner is paused)
-- and the owner index, and counts it for its plugin (the record is written by the caller).
local function index_scheduled(id, t)
  local added
  if is_held(t.plugin, t.owner) then
    added = redis.call('ZADD', K_PARKED, t.due, id)
  else
    added = due_add({ string.format('%d', t.due), id })
    local p = priority_of(t.payload)
    if p > 0 then prio_add({ '0', prio_member(p, t.due, id) }) end
    if t.owner ~= '' then
      redis.call('ZADD', owner_heads(), 'LT', string.format('%d', t.due), t.plugin .. '\0' .. t.owner)
    end
  end
  if t.owner ~= '' then redis.call('ZADD', K_BYOWNER, 0, owner_member(t.owner, t.due, id)) end
  if added > 0 then count_scheduled(t.plugin, 1, t.due) end
end

local function unindex_scheduled(id, t)
  local removed = due_remove(id, t.due)
  -- (a parked task's entry may be left from before it was parked: it goes too)
  prio_remove(priority_of(t.payload), t.due, id)
  if removed == 0 and redis.call('ZREM', K_PARKED, id) == 1 then
    removed = 1
    redis.call('ZREM', K_WAITING, wait_member(t.plugin, t.due, id))
  end
  if t.owner ~= '' then redis.call('ZREM', K_BYOWNER, owner_member(t.owner, t.due, id)) end
  if removed > 0 then count_scheduled(t.plugin, -1) end
end

-- Dead-letters a task (any state but scheduled, whose indexes the caller has left).
local function bury(id, t, now, err)
  t.st = 'x'; t.fin = string.format('%d', now); t.err = err
  redis.call('HSET', K_TASKS, id, encode(t))
  redis.call('ZADD', K_DEAD, now, id)
  redis.call('ZADD', K_BYPLUGIN, 0, dead_member(t.plugin, now, id))
end

local function unindex_dead(id, t)
  redis.call('ZREM', K_DEAD, id)
  redis.call('ZREM', K_BYPLUGIN, dead_member(t.plugin, died_at(t), id))
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
