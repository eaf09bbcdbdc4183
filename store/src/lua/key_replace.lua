#!lua flags=allow-oom
-- Replaces an API key's record if it is still the one the caller read: two changes of one key
-- never undo each other, and a key revoked meanwhile is never brought back. Its cost is one
-- HGET and one HSET of one record (at most a few KiB).
-- KEYS[1]: apikeys (HASH id -> record JSON). ARGV: id, the record as read, the new record.
-- Returns 1 when replaced, 0 when the record changed or is gone.
-- Bound: one HGET and one HSET of one key's record (a few KiB at most).
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
