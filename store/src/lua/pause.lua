#!lua flags=allow-oom
--! needs indexes walk
-- Pauses or resumes one plugin in this shard.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, op ('pause' | 'resume'), plugin, cursor ('' = start), limit, epoch (the
-- plugin's pause epoch of this op: meta's 'pe:<plugin>' keeps the latest applied, and an op
-- older than it does nothing, so a resume's later chunks never undo a pause asked for after it).
-- 'pause' marks the plugin paused: from then on claims park its due tasks (out of the due buckets, still
-- scheduled, no attempt used) and new ones are indexed as parked. Returns {0, ''}.
-- 'resume' unmarks it and moves its parked tasks back to their due buckets, looking at up to `limit` entries
-- of `parked` after `cursor` ('<due>\t<id>': called again with the returned cursor until it is '').
-- Returns {moved, next cursor}.
-- Bound: 'pause': one field; 'resume': at most `limit` entries of `parked` per call, the caller
--  walks on.
local channel, shard, op, plugin, cursor, limit = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
  tonumber(ARGV[6])
local epoch = tonumber(ARGV[7])
local applied = tonumber(redis.call('HGET', K_META, 'pe:' .. plugin)) or 0
if epoch < applied then return { 0, '' } end
if epoch > applied then redis.call('HSET', K_META, 'pe:' .. plugin, ARGV[7]) end
local mark = '\0' .. plugin .. '\0'
local list = redis.call('HGET', K_META, 'paused') or ''
local at = string.find(list, mark, 1, true)
if op == 'pause' then
  if not at then
    if list == '' then list = mark else list = list .. plugin .. '\0' end
    redis.call('HSET', K_META, 'paused', list)
  end
  return { 0, '' }
end
if at then
  list = string.sub(list, 1, at) .. string.sub(list, at + #mark)
  if list == '\0' then
    redis.call('HDEL', K_META, 'paused')
  else
    redis.call('HSET', K_META, 'paused', list)
  end
end
-- `parked` holds the parked tasks of every paused plugin, ordered by due; the walk goes on from
-- the place after the cursor's (found by rank, so the entries moved out before it do not matter)
local first = 0
if cursor ~= '' then
  local cs, cm = string.match(cursor, '^(%-?%d+)\t(.*)$')
  first = rank_of(K_PARKED, cs, cm)
  if redis.call('ZRANGE', K_PARKED, first, first)[1] == cm then first = first + 1 end
end
local page = redis.call('ZRANGE', K_PARKED, first, first + limit - 1, 'WITHSCORES')
local ids = {}
for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
-- (a task whose owner is paused stays parked: resuming the owner puts it back)
local moved = unpark(channel, shard, ids, records_of(ids), function(_, t)
  return t.plugin == plugin and not owner_paused(t.owner, plugin)
end)
if #ids < limit then return { moved, '' } end
return { moved, page[#page] .. '\t' .. page[#page - 1] } -- the last place: due, id
