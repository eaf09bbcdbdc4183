#!lua flags=allow-oom
--! needs indexes claims extras far
-- Cancels one task: a scheduled or dead task is deleted.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: id, only_dead ('1': drop it only if it is dead), plugin ('' = any: the id is the task's
-- key; else a plugin cancels a task by its id, and only a task of this plugin is cancelled), the
-- wake channel, the shard, then plugin patterns whose tasks may be cancelled too (a name, a prefix
-- ending in '*', or '*'; the plugin's may_schedule).
-- A plugin's cancel of id X cancels the first there is of: its own task X, the task X of a plugin
-- its patterns name (in their order), of a plugin they cover that has scheduled tasks in this
-- shard, and a record eggtimer 0.1.0 stored under X.
-- A listening task lets its listeners go (U messages into the outbox, see `extras`).
-- A task claimed ahead (running, due later than now) is asked of its runner (see `revoke.lua`):
-- 'revoking' and the task's key; the caller waits for the runner's answer.
-- Returns 'ok' | 'running' | 'done' | 'missing' | 'not_dead' | 'other_plugin' |
-- 'revoking' .. key.
-- Bound: one task: its record, its indexes, its listeners (an outbox message each, at most 8), its
--  window lists (UNLINK, freed off the main thread); a task claimed ahead: a revocation's request
--  and a sweep of at most REVOKE_SWEEP fields of `batches` (`ask_revoke`).
local id, only_dead, plugin, channel, shard = ARGV[1], ARGV[2] == '1', ARGV[3], ARGV[4], ARGV[5]
local PATTERNS = 6
local function covered(name)
  if plugin == '' or name == plugin then return true end
  for i = PATTERNS, #ARGV do
    local p = ARGV[i]
    if p == name or (string.sub(p, -1) == '*' and string.sub(name, 1, #p - 1) == string.sub(p, 1, -2)) then
      return true
    end
  end
  return false
end
if plugin ~= '' then
  local found = nil
  local function try(name)
    local key = name .. '\31' .. id
    if not found then far_fetch(key) end
    if not found and redis.call('HEXISTS', K_TASKS, key) == 1 then found = key end
  end
  try(plugin)
  for i = PATTERNS, #ARGV do
    if string.sub(ARGV[i], -1) ~= '*' then try(ARGV[i]) end
  end
  if not found then
    for _, name in ipairs(redis.call('HKEYS', K_SCHEDULED)) do
      if covered(name) then try(name) end
    end
  end
  id = found or id
end
far_fetch(id)
local t = parse(redis.call('HGET', K_TASKS, id))
if not t then return 'missing' end
if t.st == 'd' then return 'done' end
if not covered(t.plugin) then return 'other_plugin' end
if only_dead and t.st ~= 'x' then return 'not_dead' end
local now = now_ms()
if t.st == 'r' then
  if only_dead or t.due <= now then return 'running' end
  ask_revoke(channel, shard, id, t, 'c', 0, now)
  return 'revoking' .. id
end
forget(id, t, now)
return 'ok'
