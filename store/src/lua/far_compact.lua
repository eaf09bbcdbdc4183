#!lua flags=allow-oom
--! needs far
-- Compacts far slots: writes each slot a script appended to or took a task out of again whole,
-- with its tasks only (see the `far` part, tasks:fc). Frees memory: it runs when Redis is full.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: budget (bytes of slots to read in this call).
-- Returns how many slots are still to compact (the caller calls again while some are).
-- Bound: `budget` bytes of slots and one slot more (FAR_SLOT_BYTES).
return far_compact(tonumber(ARGV[1]))
