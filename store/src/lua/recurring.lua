#!lua
-- A recurring schedule's definition and state, on its home shard (the shard of its id).
-- KEYS[1] schedules (HASH: 'd:<id>' -> definition JSON, 'l:<id>' -> its latest firing's task id,
--         'p:<id>' -> '1' while paused)
-- KEYS[2] sched (ZSET id -> next fire time (ms), only for schedules that will fire again)
-- ARGV[1] op, ARGV[2] schedule id, then per op:
--   'put' def, next (-1: never): create or replace. 'same' (nothing changed) when the definition
--         is unchanged, so a repeated PUT never moves the next firing. A paused schedule stays paused.
--   'advance' def, expected next, new next (-1: never), latest firing id ('' = unchanged): only
--         if the schedule still fires next at `expected` under `def` (else 'moved': another runner
--         advanced it, or it was replaced, paused or deleted).
--   'pause' | 'resume' next | 'delete'
-- Returns 'created' | 'replaced' | 'same' | 'ok' | 'moved' | 'missing'.
-- Bound: one schedule's definition and state.
local K_DEFS, K_NEXT = KEYS[1], KEYS[2]
local op, id = ARGV[1], ARGV[2]
local old = redis.call('HGET', K_DEFS, 'd:' .. id)
local paused = redis.call('HEXISTS', K_DEFS, 'p:' .. id) == 1
if op == 'put' then
  if old == ARGV[3] then return 'same' end
  redis.call('HSET', K_DEFS, 'd:' .. id, ARGV[3])
  if ARGV[4] ~= '-1' and not paused then
    redis.call('ZADD', K_NEXT, ARGV[4], id)
  else
    redis.call('ZREM', K_NEXT, id)
  end
  if old then return 'replaced' end
  return 'created'
end
if not old then return 'missing' end
if op == 'advance' then
  if old ~= ARGV[3] or redis.call('ZSCORE', K_NEXT, id) ~= ARGV[4] then return 'moved' end
  if ARGV[5] ~= '-1' then redis.call('ZADD', K_NEXT, ARGV[5], id) else redis.call('ZREM', K_NEXT, id) end
  if ARGV[6] ~= '' then redis.call('HSET', K_DEFS, 'l:' .. id, ARGV[6]) end
  return 'ok'
elseif op == 'pause' then
  redis.call('HSET', K_DEFS, 'p:' .. id, '1')
  redis.call('ZREM', K_NEXT, id)
elseif op == 'resume' then
  redis.call('HDEL', K_DEFS, 'p:' .. id)
  if ARGV[3] ~= '-1' then redis.call('ZADD', K_NEXT, ARGV[3], id) end
elseif op == 'delete' then
  redis.call('HDEL', K_DEFS, 'd:' .. id, 'l:' .. id, 'p:' .. id)
  redis.call('ZREM', K_NEXT, id)
end
return 'ok'
