#!lua flags=no-writes
--! needs walk
-- One page of a score-ordered index of one shard (parked, dead), after a
-- cursor, in O(log n + page): the cursor's place is found by rank (`rank_of`), never by walking
-- what came before it.
-- KEYS[1]: the ZSET. ARGV: order ('asc' | 'desc'), cursor score, cursor member ('' with
-- score '': from the start), min score, max score, count.
-- Returns {member, score, member, score, ...}.
-- (Scores are compared as numbers but passed to Redis as the caller's strings: Lua would print a
-- large number in exponent form.)
-- Bound: O(log n + page), the page at most 1,000 (the API's limit).
local key, order, cs, cm = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local lo_s, hi_s, count = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
if order == 'asc' then
  local first
  if cm == '' then first = redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[4])
  else
    first = rank_of(key, cs, cm)
    local at = redis.call('ZRANGE', key, first, first)[1]
    if at == cm then first = first + 1 end
    first = math.max(first, redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[4]))
  end
  local page = redis.call('ZRANGE', key, first, first + count - 1, 'WITHSCORES')
  for i = 1, #page, 2 do
    if tonumber(page[i + 1]) > hi_s then break end
    out[#out + 1] = page[i]; out[#out + 1] = page[i + 1]
  end
else
  local last -- the rank of the first member to return, walking down
  if cm == '' then last = redis.call('ZCOUNT', key, '-inf', ARGV[5]) - 1
  else
    last = math.min(rank_of(key, cs, cm) - 1, redis.call('ZCOUNT', key, '-inf', ARGV[5]) - 1)
  end
  if last >= 0 then
    local page = redis.call('ZRANGE', key, math.max(last - count + 1, 0), last, 'WITHSCORES')
    for i = #page - 1, 1, -2 do
      if tonumber(page[i + 1]) < lo_s then break end
      out[#out + 1] = page[i]; out[#out + 1] = page[i + 1]
    end
  end
end
return out
