#!lua flags=allow-oom
--! needs indexes
-- Cancels one task: a scheduled or dead task is deleted.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: id, only_dead ('1': drop it only if it is dead), plugin ('' = any: else only a task of
-- this plugin is cancelled, as when a plugin cancels a task), then plugin patterns whose tasks
-- may be cancelled too (a name, a prefix ending in '*', or '*'; the plugin's may_schedule).
-- Returns 'ok' | 'running' | 'done' | 'missing' | 'not_dead' | 'other_plugin'.
local id, only_dead, plugin = ARGV[1], ARGV[2] == '1', ARGV[3]
local t = parse(redis.call('HGET', K_TASKS, id))
if not t then return 'missing' end
if t.st == 'd' then return 'done' end
local function covered(name)
  if plugin == '' or name == plugin then return true end
  for i = 4, #ARGV do
    local p = ARGV[i]
    if p == name or (string.sub(p, -1) == '*' and string.sub(name, 1, #p - 1) == string.sub(p, 1, -2)) then
      return true
    end
  end
  return false
end
if not covered(t.plugin) then return 'other_plugin' end
if only_dead and t.st ~= 'x' then return 'not_dead' end
if t.st == 'r' then return 'running' end
if t.st == 's' then unindex_scheduled(id, t) else unindex_dead(id, t) end
redis.call('HDEL', K_TASKS, id)
redis.call('HDEL', K_LOGS, id)
redis.call('HDEL', K_RERUN, id)
if t.st == 's' then redis.call('ZREM', K_UNIQUE, id) end -- unfinished: no dedup window
return 'ok'
