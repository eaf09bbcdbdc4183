#!lua flags=no-writes
--! needs shard
-- The owners with tasks due now or earlier and not started in this shard, and how many each has,
-- for the metrics per owner: the owners' heads due by now (`byowner:due`, at most ARGV[1] of
-- them, earliest first) name the candidates, and each one's index (`byowner`) counts its tasks
-- due by now (paused ones among them).
-- KEYS: the shard's keys (the `shard` part). ARGV: the most heads read.
-- Returns {owner, count, owner, count, ...}.
-- Bound: at most ARGV[1] heads, a ZLEXCOUNT (O(log n)) for each owner among them.
local limit = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local heads = redis.call('ZRANGEBYSCORE', K_BYOWNER .. ':due', '-inf', string.format('%d', now),
  'LIMIT', '0', limit)
local out, seen = {}, {}
for _, who in ipairs(heads) do
  local owner = string.match(who, '^[^%z]*%z(.*)$')
  if owner and not seen[owner] then
    seen[owner] = true
    local n = redis.call('ZLEXCOUNT', K_BYOWNER, '[' .. owner .. '\0',
      '(' .. owner .. '\0' .. string.format('%015d', now + 1))
    if n > 0 then
      out[#out + 1] = owner
      out[#out + 1] = n
    end
  end
end
return out
