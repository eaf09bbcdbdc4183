-- Schedules a batch of tasks of one shard.
-- KEYS[7..6+n]: the done-record key of each task.
-- ARGV: channel, shard, mode ('upsert' replaces a task that has not started; 'absent' only creates),
--       then 7 per task: id, due, max_attempts, plugin, owner, payload, created (0 = Redis time).
-- In 'upsert' mode the batch is all or nothing: if any of its ids is running, nothing is written
-- and the others answer 'not_written'.
-- Returns per task: 'ok' | 'running' | 'exists' | 'not_written'.
local channel, shard, mode = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local out = {}
local earliest = nil
local n = (#ARGV - 3) / 7
if mode == 'upsert' then
  local any_running = false
  for i = 0, n - 1 do
    local old = redis.call('HGET', K_TASKS, ARGV[3 + i * 7 + 1])
    out[i + 1] = 'not_written'
    if old and string.sub(old, 1, 1) == 'r' then
      out[i + 1] = 'running'
      any_running = true
    end
  end
  if any_running then return out end
  out = {}
end
for i = 0, n - 1 do
  local b = 3 + i * 7
  local id = ARGV[b + 1]
  local done_key = KEYS[7 + i]
  local old = parse(redis.call('HGET', K_TASKS, id))
  local verdict = 'ok'
  if old then
    if old.st == 'r' then verdict = 'running'
    elseif mode == 'absent' then verdict = 'exists'
    elseif old.st == 's' then unindex_scheduled(id, old)
    elseif old.st == 'x' then redis.call('ZREM', K_DEAD, id) end
  elseif redis.call('EXISTS', done_key) == 1 then
    if mode == 'absent' then verdict = 'exists' else redis.call('DEL', done_key) end
  end
  if verdict == 'ok' then
    local created = ARGV[b + 7]
    if created == '0' then created = string.format('%d', now) end
    local t = { st = 's', due = tonumber(ARGV[b + 2]), att = 0, max = tonumber(ARGV[b + 3]),
      created = created, fin = '', plugin = ARGV[b + 4], owner = ARGV[b + 5], err = '',
      payload = ARGV[b + 6] }
    redis.call('HSET', K_TASKS, id, encode(t))
    index_scheduled(id, t)
    if not earliest or t.due < earliest then earliest = t.due end
  end
  out[#out + 1] = verdict
end
if earliest then wake_if_head(channel, shard, earliest) end
return out
