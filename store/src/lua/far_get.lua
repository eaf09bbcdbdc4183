#!lua flags=no-writes
--! needs far
-- Reads far tasks (see the `far` part) as the records they will have once live.
-- KEYS: the shard's keys (the `shard` part). ARGV: task keys.
-- Returns a record per key, false where it has no far task.
-- Bound: per key, its index entry and the slot(s) it names (FAR_SLOT_BYTES each).
local out = {}
for i, key in ipairs(ARGV) do
  local f = far_find(key)
  out[i] = f and f.record or false
end
return out
