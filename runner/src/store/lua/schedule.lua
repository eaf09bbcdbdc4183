-- Schedules a batch of tasks of one shard.
-- KEYS[K_FIRST..]: the done-record key of each task in the earlier layout (done records are in
-- `tasks` now; one written before the upgrade still counts until it expires).
-- ARGV: channel, shard, mode ('upsert' replaces a task that has not started; 'absent' only creates),
--       then 8 per task: id, due, max_attempts, plugin, owner, payload, created (0 = Redis time),
--       unique_for_ms (0 = none: else scheduling the id again within that long after the task
--       finished is refused as 'duplicate').
-- In 'upsert' mode the batch is all or nothing: if any of its ids is running or inside its dedup
-- window, nothing is written and the others answer 'not_written'.
-- Returns per task: 'ok' | 'running' | 'duplicate' | 'exists' | 'not_written'.
local channel, shard, mode = ARGV[1], ARGV[2], ARGV[3]
local W = 8
local now = now_ms()
local out = {}
local earliest = nil
local n = (#ARGV - 3) / W
local uniques = redis.call('EXISTS', K_UNIQUE) == 1
if mode == 'upsert' then
  local refused = false
  for i = 0, n - 1 do
    local id = ARGV[3 + i * W + 1]
    local old = redis.call('HGET', K_TASKS, id)
    out[i + 1] = 'not_written'
    if old and string.sub(old, 1, 1) == 'r' then
      out[i + 1] = 'running'
      refused = true
    elseif uniques and in_unique_window(id, now) then
      out[i + 1] = 'duplicate'
      refused = true
    end
  end
  if refused then return out end
  out = {}
end
for i = 0, n - 1 do
  local b = 3 + i * W
  local id = ARGV[b + 1]
  local done_key = KEYS[K_FIRST + i]
  local old = parse(redis.call('HGET', K_TASKS, id))
  local verdict = 'ok'
  if old then
    if old.st == 'r' then verdict = 'running'
    elseif mode == 'absent' then verdict = 'exists'
    elseif old.st == 's' then unindex_scheduled(id, old)
    elseif old.st == 'x' then unindex_dead(id, old)
    elseif old.st == 'd' then redis.call('ZREM', K_RECENT, id) end
  elseif redis.call('EXISTS', done_key) == 1 then -- a done record of the earlier layout
    if mode == 'absent' then verdict = 'exists' else redis.call('DEL', done_key) end
  end
  if verdict == 'ok' and mode == 'absent' and uniques and in_unique_window(id, now) then
    verdict = 'exists'
  end
  if verdict == 'ok' then
    local created = ARGV[b + 7]
    if created == '0' then created = string.format('%d', now) end
    local t = { st = 's', due = tonumber(ARGV[b + 2]), att = 0, max = tonumber(ARGV[b + 3]),
      created = created, fin = '', plugin = ARGV[b + 4], owner = ARGV[b + 5], err = '',
      payload = ARGV[b + 6] }
    redis.call('HSET', K_TASKS, id, encode(t))
    index_scheduled(id, t)
    local unique_for = tonumber(ARGV[b + 8])
    if unique_for > 0 then
      redis.call('ZADD', K_UNIQUE, -unique_for, id)
    elseif uniques then
      redis.call('ZREM', K_UNIQUE, id)
    end
    if not earliest or t.due < earliest then earliest = t.due end
  end
  out[#out + 1] = verdict
end
if earliest then wake_if_head(channel, shard, earliest) end
return out
