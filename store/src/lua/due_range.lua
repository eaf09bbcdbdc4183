#!lua flags=no-writes
--! needs buckets walk
-- One page of the shard's due buckets in due order (the scheduled tasks, ascending), after a
-- cursor, in O(log n + page): the cursor's bucket is found by its bound and the place in it by
-- rank (`rank_of`).
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: cursor due, cursor id ('' with due '': from the start), min due, max due, count.
-- Returns {id, due, id, due, ...}.
-- Bound: O(log n + page), the page at most 1,000 (the API's limit).
local cs, cm, lo, hi, count = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local from = lo
if cm ~= '' and tonumber(cs) > tonumber(lo) then from = cs end
-- the bucket holding `from` (every entry at or after it is there or in a later bucket)
local start = redis.call('ZREVRANGEBYSCORE', K_DUEX, from, '-inf', 'WITHSCORES', 'LIMIT', '0',
  '1')[2] or '-inf'
local out = {}
local after = start
local first = true
while #out < 2 * count do
  local names = redis.call('ZRANGEBYSCORE', K_DUEX, after, ARGV[4], 'WITHSCORES', 'LIMIT', '0',
    '16')
  if #names == 0 then break end
  for i = 1, #names, 2 do
    local key, bound = bucket_key(names[i]), tonumber(names[i + 1])
    -- (scores in a bucket are offsets from its bound)
    local rank = redis.call('ZCOUNT', key, '-inf', offset_arg('(' .. lo, bound))
    if first and cm ~= '' then
      local r = rank_of(key, string.format('%d', tonumber(cs) - bound), cm)
      if redis.call('ZRANGE', key, r, r)[1] == cm then r = r + 1 end
      rank = math.max(rank, r)
    end
    first = false
    local need = count - #out / 2
    local page = redis.call('ZRANGE', key, rank, rank + need - 1, 'WITHSCORES')
    for j = 1, #page, 2 do
      local due = bound + tonumber(page[j + 1])
      if due > hi then return out end
      out[#out + 1] = page[j]; out[#out + 1] = string.format('%d', due)
    end
    if #out >= 2 * count then return out end
  end
  after = '(' .. names[#names]
end
return out
