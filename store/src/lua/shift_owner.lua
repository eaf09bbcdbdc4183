#!lua flags=allow-oom
--! needs indexes walk
-- Shifts up to ARGV[7] scheduled tasks of one owner in this shard (optionally only one plugin's)
-- by ±ms, continuing after a cursor, so a large owner is shifted in chunks that each hold Redis
-- only briefly. It walks the owner's index (in due order) against the direction of the shift, so
-- a task it moved lands in the part already walked and is never shifted twice.
-- Two shifts of one owner at once would cross each other's walks (one moving a task the other
-- walked past back into its way: shifted twice, or out of it: not at all), so a shift holds the
-- owner's lock in this shard from its first chunk to its last; another one waits for it.
-- KEYS: the shard's keys (the `shard` part), then KEYS[K_FIRST]: the owner's shift lock (a
-- string: the shift holding it, expiring after lock_ms unless a chunk renews it).
-- ARGV: channel, shard, owner, shift_ms, plugin ('' = all), cursor ('' = start), limit, shift id,
-- lock_ms.
-- The caller has checked that no task of the owner leaves 0..MAX_TIME; one scheduled meanwhile is
-- clamped into it.
-- Returns {moved, next cursor ('' when the owner's index is walked to its end)}, or {-1, cursor}
-- when another shift holds the lock (nothing done: try the same chunk again).
-- Bound: at most ARGV[7] tasks per call; the caller walks on from the returned cursor.
local channel, shard, owner, shift, plugin, cursor, limit = ARGV[1], ARGV[2], ARGV[3],
  tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7])
local lock, me = KEYS[K_FIRST], ARGV[8]
local holder = redis.call('GET', lock)
if holder and holder ~= me then return { -1, cursor } end
redis.call('SET', lock, me, 'PX', ARGV[9])
local lo, hi = '[' .. owner .. '\0', '(' .. owner .. '\1'
local members
if shift > 0 then
  local top = hi
  if cursor ~= '' then top = '(' .. cursor end
  members = redis.call('ZREVRANGEBYLEX', K_BYOWNER, top, lo, 'LIMIT', 0, limit)
else
  local bottom = lo
  if cursor ~= '' then bottom = '(' .. cursor end
  members = redis.call('ZRANGEBYLEX', K_BYOWNER, bottom, hi, 'LIMIT', 0, limit)
end
local moved = 0
local earliest = nil
for _, m in ipairs(members) do
  local id = string.match(m, '^[^%z]*%z%d+%z(.*)$')
  local t = parse(redis.call('HGET', K_TASKS, id))
  if t and t.st == 's' and (plugin == '' or t.plugin == plugin) then
    unindex_scheduled(id, t)
    t.due = math.min(math.max(t.due + shift, 0), MAX_TIME)
    redis.call('HSET', K_TASKS, id, encode(t))
    index_scheduled(id, t)
    moved = moved + 1
    if not earliest or t.due < earliest then earliest = t.due end
  elseif not t or t.st ~= 's' then
    redis.call('ZREM', K_BYOWNER, m) -- a stale index entry: repair
  end
end
if earliest then wake_if_head(channel, shard, earliest) end
local out = chunk_done(moved, members, limit)
if out[2] == '' then redis.call('DEL', lock) end
return out
