#!lua flags=allow-oom
--! needs indexes walk
-- Pauses or resumes one owner's tasks in this shard: all of them, or one plugin's.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, op ('pause' | 'resume'), owner, plugin ('' = all the owner's tasks),
-- cursor ('' = start), limit.
-- 'pause' marks the owner paused (meta's 'op:' .. owner, see `owner_paused`): from then on claims
-- park its due tasks (out of the due buckets, still scheduled, no attempt used) and new ones are
-- indexed as parked. Returns {0, ''}.
-- 'resume', on its first call (cursor ''), unmarks the owner's pause of `plugin`, or every pause
-- of the owner when `plugin` is '', then moves the owner's parked tasks (of `plugin`) that
-- nothing holds any more back to their due buckets, walking up to `limit` entries of the owner's
-- index after `cursor` (called again with the returned cursor until it is ''). A pause asked for
-- between two calls holds: the later calls move only tasks nothing holds.
-- Returns {moved, next cursor}.
-- Bound: 'pause': two fields; 'resume': at most `limit` tasks per call, the caller walks on.
local channel, shard, op, owner, plugin, cursor, limit = ARGV[1], ARGV[2], ARGV[3], ARGV[4],
  ARGV[5], ARGV[6], tonumber(ARGV[7])
local field = 'op:' .. owner
local list = redis.call('HGET', K_META, field)
local mark = '\0' .. (plugin == '' and '*' or plugin) .. '\0'

-- Writes the owner's list of paused plugins (none: the field goes), counting the owners paused.
local function save(new)
  if new == '\0' then new = '' end
  if new == '' and list then
    redis.call('HDEL', K_META, field)
    if redis.call('HINCRBY', K_META, 'owners-paused', '-1') <= 0 then
      redis.call('HDEL', K_META, 'owners-paused')
    end
  elseif new ~= '' then
    if not list then redis.call('HINCRBY', K_META, 'owners-paused', '1') end
    redis.call('HSET', K_META, field, new)
  end
end

if op == 'pause' then
  if not list then
    save(mark)
  elseif not string.find(list, mark, 1, true) then
    save(list .. string.sub(mark, 2))
  end
  return { 0, '' }
end
if cursor == '' and list then
  if plugin == '' then
    save('')
  else
    local at = string.find(list, mark, 1, true)
    if at then save(string.sub(list, 1, at) .. string.sub(list, at + #mark)) end
  end
end
local bottom = '[' .. owner .. '\0'
if cursor ~= '' then bottom = '(' .. cursor end
local members = redis.call('ZRANGEBYLEX', K_BYOWNER, bottom, '(' .. owner .. '\1', 'LIMIT', 0, limit)
local ids = {}
for i, m in ipairs(members) do ids[i] = string.match(m, '^[^%z]*%z%d+%z(.*)$') end
local moved = unpark(channel, shard, ids, records_of(ids), function(id, t)
  return (plugin == '' or t.plugin == plugin) and not is_held(t.plugin, t.owner)
    and redis.call('ZSCORE', K_PARKED, id) ~= false
end)
return chunk_done(moved, members, limit)
