#!lua flags=allow-oom
-- Appends one entry to an audit stream, then trims the stream to about `max_len` entries and to
-- those at or after `min_id`. It runs when Redis is out of memory too (the stream is bounded):
-- a change made while Redis is full (a cancel, a dead letter dropped to free memory) is audited
-- all the same.
-- KEYS: the stream (the changes' or the refusals'). ARGV: max_len, min_id (ms), then the entry's
-- field, value pairs.
-- Returns the entry's id.
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 3))
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[2])
return id
