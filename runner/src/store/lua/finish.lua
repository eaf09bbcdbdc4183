-- Records the outcomes of a batch of claimed tasks of one shard.
-- KEYS[6..5+n]: the done-record key of each task.
-- ARGV: channel, shard, keep_done_ms, then 5 per task: id, attempt, kind, value, error.
--   kind 'done'    -> the record moves to its done key (expires after keep_done_ms)
--   kind 'retry'   -> due again in `value` ms, or dead when attempts reached max_attempts
--   kind 'dead'    -> dead-lettered with `error`
--   kind 'again'   -> the same task runs again at `value` (ms), attempts reset
--   kind 'release' -> not started (shutdown): back to its due time, the attempt given back
-- Fenced: an outcome whose attempt no longer holds the task (reaped, or claimed again) is
-- refused ('stale'). A late outcome of an expired lease not yet reaped is still accepted: nobody
-- else has the task, so accepting it saves a duplicate run.
-- Returns per task: 'done' | 'retry' | 'dead' | 'again' | 'release' | 'stale'.
local channel, shard, keep = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local out = {}
local earliest = nil
local n = (#ARGV - 3) / 5
for i = 0, n - 1 do
  local b = 3 + i * 5
  local id, attempt, kind, value, err = ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3],
    tonumber(ARGV[b + 4]), ARGV[b + 5]
  local rec = redis.call('HGET', K_TASKS, id)
  local verdict = 'stale'
  local st, att
  if rec then st, att = string.match(rec, '^(%a)\t%-?%d+\t(%d+)\t') end
  -- the fence: still running, in this attempt (a reaped or re-claimed task has moved on)
  if st == 'r' and tonumber(att) == attempt then
    redis.call('ZREM', K_INFLIGHT, id)
    if kind == 'done' then
      -- hot path: flip the state and set the finish time without decoding the record
      local done = string.gsub(rec, '^r(\t%-?%d+\t%d+\t%d+\t%d+\t)%d*', 'd%1' .. string.format('%d', now), 1)
      redis.call('HDEL', K_TASKS, id)
      redis.call('SET', KEYS[6 + i], done, 'PX', keep)
    else
      local t = parse(rec)
      if kind == 'retry' and t.att >= t.max then kind = 'dead' end
      if kind == 'dead' then
        t.st = 'x'; t.fin = string.format('%d', now); t.err = err
        redis.call('HSET', K_TASKS, id, encode(t))
        redis.call('ZADD', K_DEAD, now, id)
      else
        if kind == 'retry' then t.due = now + value; t.err = err
        elseif kind == 'again' then t.due = math.max(value, 0); t.att = 0; t.err = ''
        else t.att = t.att - 1 end -- release
        t.st = 's'
        redis.call('HSET', K_TASKS, id, encode(t))
        index_scheduled(id, t)
        if not earliest or t.due < earliest then earliest = t.due end
      end
    end
    verdict = kind
  end
  out[#out + 1] = verdict
end
if earliest then wake_if_head(channel, shard, earliest) end
return out
