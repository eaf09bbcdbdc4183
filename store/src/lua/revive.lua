#!lua flags=allow-oom
--! needs indexes
-- Puts one dead task back: due now, attempts reset, its last error let go (its run logs keep it).
-- KEYS: the shard's keys (the `shard` part). ARGV: channel, shard, id.
-- Returns {'ok', due} | {'missing'} | {'not_dead'}.
-- Bound: one task.
local channel, shard, id = ARGV[1], ARGV[2], ARGV[3]
local t = parse(redis.call('HGET', K_TASKS, id))
if not t or t.st == 'd' then return { 'missing' } end
if t.st ~= 'x' then return { 'not_dead' } end
unindex_dead(id, t)
t.st = 's'; t.att = 0; t.fin = ''; t.err = ''; t.due = now_ms(); t.created = string.format('%d', t.due)
redis.call('HSET', K_TASKS, id, encode(t))
index_scheduled(id, t)
wake_if_head(channel, shard, t.due)
return { 'ok', t.due }
