#!lua flags=no-writes
--! needs far
-- Reads tasks in either tier, for a reader that found no record of them: a key's live record
-- where it has one now (a script may have brought its far task back since the reader's read of
-- the records: both are read here at one instant), else the record its far task (see the `far`
-- part) will have once live.
-- KEYS: the shard's keys (the `shard` part). ARGV: task keys.
-- Returns a record per key, false where it has neither.
-- Bound: per key, its record, its index entry and the slot(s) it names (FAR_SLOT_BYTES each).
local out = {}
for i, key in ipairs(ARGV) do
  local live = redis.call('HGET', K_TASKS, key)
  if live then out[i] = live
  else
    local f = far_find(key)
    out[i] = f and f.record or false
  end
end
return out
