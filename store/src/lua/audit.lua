#!lua flags=allow-oom
-- Appends one entry to an audit stream, then trims the stream to about `max_len` entries and to
-- those at or after `min_id`. It runs when Redis is out of memory too (the stream is bounded):
-- a change made while Redis is full (a cancel, a dead letter dropped to free memory) is audited
-- all the same. A refusal also counts against its key (KEYS[2]: HASH key id -> refusals, one
-- field per key an admin made, the admin's and the unknown's), which the trim never forgets.
-- Its cost: one XADD, one XTRIM of what fell out of the bounds, one HINCRBY.
-- KEYS: the stream (the changes' or the refusals'), the refusal counts (refusals only).
-- ARGV: max_len, min_id (ms), the key id to count ('' for a change), then the entry's field,
-- value pairs.
-- Returns the entry's id.
-- Bound: one XADD and an XTRIM of what fell outside the bounds (a few entries, amortized), one
--  HINCRBY.
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 4))
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[2])
if KEYS[2] then redis.call('HINCRBY', KEYS[2], ARGV[3], 1) end
return id
