#!lua
-- Whether Redis takes writes now. It writes nothing, but it is a script that may write, and
-- Redis refuses those whole (with OOM) while it is out of memory.
-- KEYS[1]: a key of the shard asked about (it routes the call to the shard's node in a cluster).
-- Returns 1.
-- Bound: nothing (a write that is never made).
return 1
