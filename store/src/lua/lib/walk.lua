--! part walk
-- Walks of an index in pieces, so one script holds Redis only briefly.

-- A chunked walk's answer: the count, and where the next chunk starts ('' when this chunk did
-- not fill up, so the walk is over).
local function chunk_done(count, members, limit)
  if #members == limit then return { count, members[#members] } end
  return { count, '' }
end

-- Whether the string `a` comes before `b` byte by byte, as Redis orders the members of equal
-- score. (Lua's `<` collates by the C library's locale, which a Redis started under a UTF-8
-- locale inherits: 'a' < 'B' there, while Redis puts 'B' first.)
local function bytes_before(a, b)
  if a == b then return false end
  local n = math.min(#a, #b)
  local i = 1
  -- (compare runs of 16 bytes as strings first: equal runs are one comparison)
  while i + 15 <= n and string.sub(a, i, i + 15) == string.sub(b, i, i + 15) do i = i + 16 end
  while i <= n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
    i = i + 1
  end
  return #a < #b
end

-- The number of members of the ZSET `key` ordered before the place (score `s`, member `m`), in
-- O(log n): binary search by rank among the members of score `s`, never a walk from the start.
-- `s` is passed to Redis as the caller's string (Lua would print a large number in exponent form).
local function rank_of(key, s, m)
  local lo = redis.call('ZCOUNT', key, '-inf', '(' .. s)
  local hi = redis.call('ZCOUNT', key, '-inf', s)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local at = redis.call('ZRANGE', key, mid, mid)[1]
    if bytes_before(at, m) then lo = mid + 1 else hi = mid end
  end
  return lo
end
