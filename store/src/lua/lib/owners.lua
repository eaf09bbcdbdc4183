--! part owners
--! needs shard record buckets priority indexes
-- Fair share between owners. A claim takes due tasks in due order, so one owner's backlog (a
-- merchant's 200,000 timeouts due at one instant) would hold every other owner's due tasks
-- behind it. Where two or more owners (of any plugins) have tasks due in this shard, by their
-- heads (`owner_heads`), and the shard's earliest due task is late (a backlog: more falls due
-- than its runners take), a claim instead gives its places in turns: each owner in turn (round
-- robin over the claims of the shard, from meta's 'owner-turn' counter) takes up to its share
-- of its own earliest due tasks, found through the owner index, not the buckets; one turn of
-- each round is the due order's (tasks without an owner, and owners past the turns of this
-- claim). Places left after the turns go in due order as well. An owner's weight among a
-- plugin's owners (meta's 'ow:' plugin \0 owner, set on every shard) is its share of a claim's
-- places against the others' of the claim's turns.
-- Priority (see `priority`) orders the due order's turns and what an owner's turn walks (its
-- earliest due tasks, up to twice its share and 8 more): inside an owner's turn, the higher
-- first.
-- A task is taken only if it is in its due bucket (a parked one, paused or set aside for its
-- plugin's share, is not), so nothing is taken twice, and the rest of the claim (plugins' fair
-- share, pauses, the claim's byte bound) sees the tasks taken here as if the due order had
-- brought them.

-- Most owners given a turn by one claim.
local MAX_OWNER_TURNS = 64
-- How late the shard's earliest due task must be for owners to take turns: claims that keep up
-- with what falls due (its earliest is not late) hold no one back, and take in due order at the
-- due order's cost; a backlog makes it late at once.
local TURNS_AFTER_MS = 50

-- The entries of `owner`'s index due from `from` up to `now` (numbers), at most `limit`.
local function owner_due_entries(owner, from, now, limit)
  return redis.call('ZRANGEBYLEX', K_BYOWNER,
    '[' .. owner .. '\0' .. string.format('%015d', math.max(from, 0)),
    '(' .. owner .. '\0' .. string.format('%015d', now + 1), 'LIMIT', '0', string.format('%d', limit))
end

-- Takes up to `share` of the due tasks of `plugin` and `owner` (head `head`) out of their
-- buckets into `ids`; then sets the head to what is left: the due time where it stopped, that
-- of the owner's next task after `now`, or none. Returns how many it took.
local function owner_turn(who, head, now, share, ids)
  local plugin, owner = string.match(who, '^([^%z]*)%z(.*)$')
  local walk = share * 2 + 8
  local entries = owner_due_entries(owner, head, now, walk)
  local eids, edues = {}, {}
  for i, m in ipairs(entries) do
    local due, id = string.match(m, '%z(%d+)%z(.*)$')
    eids[i], edues[i] = id, tonumber(due)
  end
  local recs = records_of(eids)
  -- the order the walked tasks are taken in: due order, or the higher priority first where the
  -- shard has priorities (the due order kept among equals)
  local order = {}
  for i = 1, #eids do order[i] = i end
  if has_priorities() then
    local prio = {}
    for i = 1, #eids do prio[i] = recs[i] and record_priority(recs[i]) or 0 end
    table.sort(order, function(a, b)
      if prio[a] ~= prio[b] then return prio[a] > prio[b] end
      return a < b
    end)
  end
  local took, stopped = 0, nil
  turns_taken = true
  for _, i in ipairs(order) do
    local id = eids[i]
    if took == share then
      -- the earliest walked and not taken is where the owner's head goes
      if not stopped or edues[i] < stopped then stopped = edues[i] end
    else
      local rec = recs[i]
      local p = rec and string.match(rec, '^s\t%-?%d+\t%d+\t%d+\t%d+\t%d*\t([^\t]*)\t')
      if p == plugin and due_remove(id, edues[i]) == 1 then
        ids[#ids + 1] = id
        if taken_dues then taken_dues[id], taken_owners[id] = edues[i], who end
        took = took + 1
      end
    end
  end
  if #entries == walk and (not stopped or edues[walk] < stopped) then stopped = edues[walk] end
  if stopped then
    redis.call('ZADD', owner_heads(), 'XX', string.format('%d', stopped), who)
  else
    local next = redis.call('ZRANGEBYLEX', K_BYOWNER,
      '[' .. owner .. '\0' .. string.format('%015d', now + 1), '(' .. owner .. '\1', 'LIMIT', '0', '1')[1]
    if next then
      redis.call('ZADD', owner_heads(), 'XX', string.match(next, '%z0*(%d+)%z'), who)
    else
      redis.call('ZREM', owner_heads(), who)
    end
  end
  return took
end

-- The heads of owners whose tasks a claim took (`taken`: owner -> {plugin -> true}) that have
-- no task left here go: an owner whose every task was claimed leaves no head behind.
local function drop_owner_heads(taken)
  local gone = {}
  for owner, plugins in pairs(taken) do
    if not redis.call('ZRANGEBYLEX', K_BYOWNER, '[' .. owner .. '\0', '(' .. owner .. '\1',
        'LIMIT', '0', '1')[1] then
      for plugin in pairs(plugins) do gone[#gone + 1] = plugin .. '\0' .. owner end
    end
  end
  call_many('ZREM', owner_heads(), gone)
end

-- Takes up to `limit` due tasks at `now` out of the buckets, as `ordered_take` does (by
-- priority, those due `aging` ms ago first), but in owners' turns where two or more owners have
-- tasks due here (`has_owners`: the owner index exists).
-- Returns their ids, and the shard's earliest due time after them when it was seen on the way
-- (nil when not). `peek`: where no owners take turns, the ids may be left in their buckets (see
-- `peeked`).
local function fair_take(now, limit, has_owners, aging, peek)
  if not has_owners or limit == 0 then return ordered_take(now, limit, aging, peek) end
  local key, now_s = owner_heads(), string.format('%d', now)
  local n = redis.call('ZCOUNT', key, '-inf', now_s)
  if n < 2 then return ordered_take(now, limit, aging, peek) end
  local earliest = head_due()
  if earliest < 0 or earliest > now - TURNS_AFTER_MS then
    return ordered_take(now, limit, aging, peek)
  end
  -- a round is the n owners due here (by their heads' order) and the due order's turn (place
  -- n); this claim serves up to `turns` places of it from where the shard's last claim stopped
  local turns = math.min(n, MAX_OWNER_TURNS) + 1
  local first = (tonumber(redis.call('HGET', K_META, 'owner-turn')) or 0) % (n + 1)
  -- the owners of those places, read before any turn moves a head
  local window = {}
  local function read(from, count)
    if count <= 0 then return end
    local got = redis.call('ZRANGEBYSCORE', key, '-inf', now_s, 'WITHSCORES', 'LIMIT',
      string.format('%d', from), string.format('%d', count))
    for i = 1, #got, 2 do window[#window + 1] = { got[i], tonumber(got[i + 1]) } end
  end
  -- the places first .. first + turns - 1, past n from 0 again: owners of ranks `first` on,
  -- then (after the due order's turn) of ranks 0 on
  read(first, math.min(first + turns - 1, n - 1) - first + 1)
  read(0, first + turns - n - 1)
  -- each owner's share of the places by its weight among those of this claim's turns (meta's
  -- 'ow:' plugin \0 owner; 1 unset), the due order's turn weighing 1
  local weights, total = {}, 1
  if #window > 0 then
    local fields = {}
    for i, w in ipairs(window) do fields[i] = 'ow:' .. w[1] end
    weights = redis.call('HMGET', K_META, unpack(fields))
    for i = 1, #window do
      weights[i] = math.max(tonumber(weights[i]) or 1, 1)
      total = total + weights[i]
    end
  end
  local function share(weight) return math.max(1, math.floor(limit * weight / total)) end
  local ids, head, served, w = {}, nil, 0, 1
  local place = first
  while served < turns and #ids < limit do
    if place == n then
      local got, h = ordered_take(now, math.min(share(1), limit - #ids), aging)
      for _, id in ipairs(got) do ids[#ids + 1] = id end
      head = h
    elseif window[w] then
      owner_turn(window[w][1], window[w][2], now, math.min(share(weights[w]), limit - #ids), ids)
      w = w + 1
    end
    served = served + 1
    place = (place + 1) % (n + 1)
  end
  redis.call('HSET', K_META, 'owner-turn', string.format('%d', (first + served) % (n + 1)))
  if #ids < limit then
    local got, h = ordered_take(now, limit - #ids, aging)
    for _, id in ipairs(got) do ids[#ids + 1] = id end
    head = h
  end
  return ids, head
end
