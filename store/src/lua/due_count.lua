#!lua flags=no-writes
--! needs buckets
-- Counts the shard's scheduled tasks in its due buckets per range of due times: the ranges are
-- [e1, e2), [e2, e3), ... for the edges ARGV[3..] (ms, ascending; the first may be '-inf', the
-- last '+inf'). Looks at up to ARGV[2] buckets from ARGV[1] (where the previous call stopped:
-- '(' and a bucket bound; '' = the bucket holding e1).
-- KEYS: the shard's keys (the `shard` part).
-- Returns {the count of each range, ..., where the next call starts ('' when all is walked)}: a
-- range over many buckets is counted a bounded piece per call, so Redis is never held long.
-- Bound: at most ARGV[2] buckets per call; the caller walks on from the returned place.
local from, limit = ARGV[1], tonumber(ARGV[2])
local edges, e = {}, {}
for i = 3, #ARGV do
  edges[#edges + 1] = ARGV[i]
  e[#e + 1] = tonumber(ARGV[i])
end
local k = #edges - 1
if from == '' then
  from = '-inf'
  if edges[1] ~= '-inf' then
    from = redis.call('ZREVRANGEBYSCORE', K_DUEX, edges[1], '-inf', 'WITHSCORES', 'LIMIT', '0',
      '1')[2] or '-inf'
  end
end
-- one bucket more than those counted: its bound ends the last one's range
local names = redis.call('ZRANGEBYSCORE', K_DUEX, from, '(' .. edges[k + 1], 'WITHSCORES',
  'LIMIT', '0', string.format('%d', limit + 1))
local out = {}
for i = 1, k do out[i] = 0 end
local r = 1
local last = math.min(#names, 2 * limit)
for i = 1, last, 2 do
  local bound, ends = tonumber(names[i + 1]), tonumber(names[i + 3]) or math.huge
  local key = bucket_key(names[i])
  while r < k and e[r + 1] <= bound do r = r + 1 end
  local j = r
  while j <= k and e[j] < ends do
    -- (scores in a bucket are offsets from its bound)
    out[j] = out[j] + redis.call('ZCOUNT', key, offset_arg(edges[j], bound),
      offset_arg('(' .. edges[j + 1], bound))
    j = j + 1
  end
end
if #names <= 2 * limit then
  out[k + 1] = ''
else
  out[k + 1] = '(' .. names[last]
end
return out
