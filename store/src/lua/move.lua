#!lua flags=allow-oom
--! needs indexes claims far
-- Moves one scheduled task. KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, id, mode ('at' | 'shift' | 'now' | 'wake'), value (ms), and for 'wake'
-- created, attempts; for the others, optionally a claim token: the task is moved only while it
-- runs under that claim (else {'missing'}; an owner's shift revoking a task claimed ahead).
-- 'wake' moves a run put back to wait for a concurrency slot to now, only while it still waits
-- so: the same occurrence (`created`) with the same attempts, due within `value` ms (a task moved
-- later since, replaced or run again is left alone: {'missing'}).
-- A task claimed ahead (running, due later than now) is asked of its runner (see `revoke.lua`):
-- {'revoking'}, and the caller waits for the runner's answer (all but 'wake').
-- Returns {'ok', due} | {'revoking'} | {'running'} | {'done'} | {'dead'} | {'missing'} |
-- {'out_of_range'} (a shift that would leave 0..MAX_TIME: nothing moved).
-- Bound: one task (and one wake message); a task claimed ahead: a revocation's request and a
--  sweep of at most REVOKE_SWEEP fields of `batches` (`ask_revoke`).
local channel, shard, id, mode, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
far_fetch(id)
local t = parse(redis.call('HGET', K_TASKS, id))
if not t then return { 'missing' } end
if t.st == 'x' then return { 'dead' } end
if t.st == 'd' then return { 'done' } end
local claim = mode ~= 'wake' and ARGV[6] or nil
if claim and (t.st ~= 'r' or t.fin ~= claim) then return { 'missing' } end
local now = now_ms()
if t.st == 'r' and (mode == 'wake' or t.due <= now) then return { 'running' } end
local due
if mode == 'wake' then
  due = now
  if t.created ~= ARGV[6] or t.att ~= tonumber(ARGV[7]) or t.due > due + value then
    return { 'missing' }
  end
elseif mode == 'at' then due = value
elseif mode == 'shift' then due = t.due + value
else due = now end
if due < 0 or due > MAX_TIME then return { 'out_of_range' } end
if t.st == 'r' then
  ask_revoke(channel, shard, id, t, 'm', due, now)
  return { 'revoking' }
end
unindex_scheduled(id, t)
t.due = due
redis.call('HSET', K_TASKS, id, encode(t))
index_scheduled(id, t)
wake_if_head(channel, shard, t.due)
return { 'ok', t.due }
