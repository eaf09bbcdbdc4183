#!lua flags=allow-oom
--! needs claims extras
-- A cancel or a move of a task claimed ahead (running to the store, not started: its due time is
-- still to come) is a revocation, asked of the runner that holds it and judged here, by Redis's
-- clock, so the runner and the one who asked can't disagree:
-- - `cancel.lua`/`move.lua` write the request into `batches` (field 'rv' \31 id: 'token deadline
--   action value state', action 'c' cancel or 'm' move to `value`, state 'p' pending) and
--   publish 'v<shard>:<token>:<id>' on the wake channel;
-- - the holder, having taken the task out of its wait (so it will not start it), applies the
--   request ('apply'): only while the task is still running under that claim and before the
--   deadline; else it starts the task after all. A holder that already started it refuses
--   ('refuse');
-- - the asker waits ('wait'): the request applied, refused, or past its deadline ends it, and a
--   request past its deadline can't be applied any more.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: mode ('apply' | 'refuse' | 'wait'), id (the task's key), then for 'apply' and 'refuse'
-- the claim token, the wake channel and the shard.
-- Returns: 'apply' -> 'ok' | 'no'; 'refuse' -> 'ok'; 'wait' -> {'pending'} | {'applied', due}
-- (a cancel's due is 0) | {'refused'}.
-- Bound: one task (its record, indexes, listeners as a cancel's).
local mode, id = ARGV[1], ARGV[2]
local field = 'rv\31' .. id
local req = redis.call('HGET', K_BATCHES, field)
local now = now_ms()
local token, deadline, action, value, state
if req then
  token, deadline, action, value, state = string.match(req, '^(%d+) (%d+) (%a) (%-?%d+) (%a)$')
  deadline, value = tonumber(deadline), tonumber(value)
end
if mode == 'wait' then
  if not state then return { 'refused' } end
  if state == 'a' then
    redis.call('HDEL', K_BATCHES, field)
    return { 'applied', value }
  end
  if state == 'n' or now > deadline then
    redis.call('HDEL', K_BATCHES, field)
    return { 'refused' }
  end
  return { 'pending' }
end
if not state or token ~= ARGV[3] or state ~= 'p' then return 'no' end
-- the request's end: 'a' applied, 'n' refused (read and dropped by the asker's wait)
local function settle(to)
  redis.call('HSET', K_BATCHES, field,
    string.format('%s %d %s %d %s', token, deadline, action, value, to))
end
if mode == 'refuse' or now > deadline then
  settle('n')
  return mode == 'refuse' and 'ok' or 'no'
end
local t = parse(redis.call('HGET', K_TASKS, id))
if not t or t.st ~= 'r' or t.fin ~= token then
  settle('n')
  return 'no'
end
-- the claim ends as a release's does: not started, its attempt given back
release_batches({ [token] = 1 })
count_running(t.plugin, -1)
t.att = t.att - 1
if action == 'c' then
  record_ended(id, t, now, false)
  redis.call('ZREM', K_UNIQUE, id)
  forget(id, t, now)
  value = 0
else
  t.st = 's'; t.fin = ''; t.due = value
  redis.call('HSET', K_TASKS, id, encode(t))
  index_scheduled(id, t)
  wake_if_head(ARGV[4], ARGV[5], t.due)
end
settle('a')
return 'ok'
