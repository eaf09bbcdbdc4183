#!lua
-- Charges one key's publish of events against its budget: the bytes of events it published
-- within the event retention (what Redis keeps of them for tasks' lookback), counted in buckets
-- of `bucket_ms` (at most about 60 of them: a call's work is bounded by that, never by what was
-- published). Refused whole when the charge would pass `limit`; nothing is written then.
-- KEYS[1]: the key's budget (HASH bucket start ms -> bytes published in it).
-- ARGV: bytes, limit, retention_ms, bucket_ms.
-- Returns {1, bytes within the retention after the charge} | {0, bytes within it before}.
-- Bound: the key's buckets within the event retention (about 60).
local bytes, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local retention, bucket = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = now - retention
local used, old = 0, {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  -- a bucket counts while any of it is within the retention
  if tonumber(all[i]) + bucket > since then
    used = used + tonumber(all[i + 1])
  else
    old[#old + 1] = all[i]
  end
end
if #old > 0 then redis.call('HDEL', KEYS[1], unpack(old)) end
if used + bytes > limit then return { 0, used } end
local at = now - now % bucket
redis.call('HINCRBY', KEYS[1], string.format('%d', at), bytes)
redis.call('PEXPIRE', KEYS[1], retention + bucket)
return { 1, used + bytes }
