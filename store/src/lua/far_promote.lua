#!lua
--! needs far
-- Moves far tasks into the live tier ahead of their due time (see the `far` part).
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: channel, shard, lead (ms: the slots starting within that long from now move), limit (the
-- most tasks to move in this call, past which no further slot is taken).
-- Returns how many moved (the caller calls again while that reaches `limit`).
-- Bound: `limit` tasks and one slot more (FAR_SLOT_BYTES of tasks).
local channel, shard = ARGV[1], ARGV[2]
local lead, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
if not far_in_use() then return 0 end
local moved, earliest = far_promote(now_ms() + lead, limit)
if earliest then wake_if_head(channel, shard, earliest) end
return moved
