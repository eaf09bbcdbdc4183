#!lua flags=allow-oom
--! needs indexes
-- Gives the owned tasks a data layout before the owners' heads (eggtimer 0.2.0's) left without
-- one their heads (`owner_heads`: plugin \0 owner -> a lower bound of the due times of its tasks
-- in the due buckets), so owners take turns over them as over new ones: walks the owner index
-- (`byowner`) after a cursor, and lowers each owner's head per plugin to its earliest task here
-- that is in a due bucket (a parked one, paused or set aside, is not). Once the walk reaches the
-- end it marks the shard done (meta's 'owner-heads'). Lowering only (`ZADD LT`), so a claim or a
-- schedule meanwhile, or two runners walking at once, leave heads as valid lower bounds.
-- KEYS: the shard's keys (the `shard` part). ARGV: cursor ('' = from the start), limit.
-- Returns {heads lowered, next cursor ('' when the index is walked to its end, or was before)}.
-- Bound: at most `limit` index entries per call; the caller walks on.
local cursor, limit = ARGV[1], tonumber(ARGV[2])
if cursor == '' and redis.call('HEXISTS', K_META, 'owner-heads') == 1 then return { 0, '' } end
local lo = '-'
if cursor ~= '' then lo = '(' .. cursor end
local members = redis.call('ZRANGEBYLEX', K_BYOWNER, lo, '+', 'LIMIT', '0', string.format('%d', limit))
local earliest, order = {}, {}
for _, m in ipairs(members) do
  local owner, due, id = string.match(m, '^([^%z]*)%z(%d+)%z(.*)$')
  if owner and not redis.call('ZSCORE', K_PARKED, id) then
    local plugin = string.match(id, '^([^\31]+)\31')
    if not plugin then -- a key 0.1.0 wrote (a bare id): its record names the plugin
      local t = parse(redis.call('HGET', K_TASKS, id))
      plugin = t and t.plugin
    end
    if plugin then
      local who = plugin .. '\0' .. owner
      -- the walk is in owner and due order: an owner's first task here is its earliest
      if not earliest[who] then
        earliest[who] = due
        order[#order + 1] = who
      end
    end
  end
end
local list = {}
for _, who in ipairs(order) do
  list[#list + 1] = string.format('%d', tonumber(earliest[who]))
  list[#list + 1] = who
end
if #list > 0 then lower_owner_heads(list) end
if #members < limit then
  redis.call('HSET', K_META, 'owner-heads', '1')
  return { #order, '' }
end
return { #order, members[#members] }
