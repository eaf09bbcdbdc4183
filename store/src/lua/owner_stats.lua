#!lua flags=no-writes
--! needs record
-- Counts one owner's tasks in this shard per plugin and state, a bounded piece per call: its
-- scheduled tasks from its index (`byowner`; the plugin from each task's key, no record read),
-- its running ones from the claim batches (`batches`: each listed task's record, counted where
-- it still runs under that batch's claim), its dead ones from `dead` (each record read).
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: owner, cursor ('' = from the start), limit (index entries a call walks), record limit
-- (records a call reads).
-- A cursor is a state's letter and a place: 's' .. the `byowner` member walked last, 'r' .. an
-- HSCAN cursor of `batches`, 'x' .. a rank in `dead`.
-- Returns {the state counted ('s' | 'r' | 'x'), the next cursor ('' when the shard is walked),
-- plugin, count, plugin, count, ...}. Each call counts one moment; a task that changes state
-- between two calls of one walk may be counted twice or not at all.
-- Bound: at most `limit` index entries or `record limit` dead records per call; the caller walks
-- on. The running tasks: the batches an HSCAN of about `record limit` fields returns (a small
-- hash answers whole), each of at most a claim's batch; they are bounded by the runners' room.
local owner, cursor, limit, rlimit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local counts, order = {}, {}

local function add(plugin)
  if not counts[plugin] then
    counts[plugin] = 0
    order[#order + 1] = plugin
  end
  counts[plugin] = counts[plugin] + 1
end

local function reply(st, next)
  local out = { st, next }
  for _, p in ipairs(order) do
    out[#out + 1] = p
    out[#out + 1] = counts[p]
  end
  return out
end

-- The state, claim token (`fin`), plugin and owner of a stored record, without its payload.
local function head(rec)
  if not rec then return nil end
  return string.match(rec, '^(%a)\t%-?%d+\t%d+\t%d+\t%d+\t(%d*)\t([^\t]*)\t([^\t]*)\t')
end

local st, at = string.sub(cursor, 1, 1), string.sub(cursor, 2)
if cursor == '' then st = 's' end

if st == 's' then
  local lo = '[' .. owner .. '\0'
  if at ~= '' then lo = '(' .. at end
  local members = redis.call('ZRANGEBYLEX', K_BYOWNER, lo, '(' .. owner .. '\1', 'LIMIT', '0',
    string.format('%d', limit))
  for _, m in ipairs(members) do
    local id = string.match(m, '^[^%z]*%z%d+%z(.*)$')
    local plugin = string.match(id, '^([^\31]+)\31')
    if not plugin then -- a key 0.1.0 wrote (a bare id): its record names the plugin
      local _, _, p = head(redis.call('HGET', K_TASKS, id))
      plugin = p
    end
    if plugin then add(plugin) end
  end
  if #members == limit then return reply('s', 's' .. members[#members]) end
  return reply('s', 'r0')
end

if st == 'r' then
  local scan = redis.call('HSCAN', K_BATCHES, at, 'COUNT', string.format('%d', rlimit))
  for i = 1, #scan[2], 2 do
    local token, ids = scan[2][i], scan[2][i + 1]
    if string.match(token, '^%d+$') then
      for id in string.gmatch(ids, '[^\t]+') do
        local s, fin, plugin, o = head(redis.call('HGET', K_TASKS, id))
        if s == 'r' and fin == token and o == owner then add(plugin) end
      end
    end
  end
  if scan[1] ~= '0' then return reply('r', 'r' .. scan[1]) end
  return reply('r', 'x0')
end

local from = tonumber(at) or 0
local ids = redis.call('ZRANGE', K_DEAD, string.format('%d', from), string.format('%d', from + rlimit - 1))
if #ids > 0 then
  local recs = redis.call('HMGET', K_TASKS, unpack(ids))
  for i = 1, #ids do
    local s, _, plugin, o = head(recs[i])
    if s == 'x' and o == owner then add(plugin) end
  end
end
if #ids == rlimit then return reply('x', 'x' .. string.format('%d', from + rlimit)) end
return reply('x', '')
