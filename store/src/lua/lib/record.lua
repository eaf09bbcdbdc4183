--! part record
--! needs shard
-- A record is ten tab-separated fields, the payload last (it may hold anything):
--   state(s|r|d|x) due attempts max_attempts created fin plugin owner last_error payload
-- `fin` is the finish time (ms) of a done or dead task, the claim token of a running one (the
-- fence: finish, renew and effects must name it), and empty for a scheduled one.

local function parse(rec)
  if not rec then return nil end
  -- the payload's start as a position, then one copy: a `(.*)` capture would walk the payload
  -- a character at a time (a 64 KiB payload: ~0.5 ms of Redis)
  local st, due, att, max, cr, fin, plugin, owner, err, at = string.match(rec,
    '^(%a)\t(%-?%d+)\t(%d+)\t(%d+)\t(%d+)\t(%d*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t()')
  if not st then return nil end
  return { st = st, due = tonumber(due), att = tonumber(att), max = tonumber(max), created = cr,
    fin = fin, plugin = plugin, owner = owner, err = err, payload = string.sub(rec, at) }
end

-- The lists holding a debounced task's payloads beside its record (see `extras`): its window's,
-- and the next window's. They go with the record.
local function window_key(id) return K_TASKS .. ':w:' .. id end
local function next_key(id) return K_TASKS .. ':n:' .. id end

local function encode(t)
  return table.concat({ t.st, string.format('%d', t.due), string.format('%d', t.att),
    string.format('%d', t.max), t.created, t.fin, t.plugin, t.owner, t.err, t.payload }, '\t')
end

-- What a record holds in Redis for its plugin's budget of task bytes (`by:` plugin in `meta`,
-- see `charge`): its last field from `at` on (payload, listeners, the event that reached it) and
-- the bytes a debounced one's lists hold (its `w` and `N` extras, see `extras`). Every script
-- that writes a record's last field or deletes a record charges the difference, so a plugin's
-- count is the sum over its records (those 0.2.0 wrote count from their first rewrite). A
-- payload is JSON, which holds no control character, so the extras' marks are found by byte.
local function weight(last, at)
  at = at or 1
  local n = #last - at + 1
  local s = string.find(last, '\28', at, true)
  if s then
    local e = string.find(last, '\28', s + 1, true) or #last
    local ex = string.sub(last, s, e)
    n = n + (tonumber(string.match(ex, '[\28\31]w%d+\30(%d+)')) or 0)
      + (tonumber(string.match(ex, '[\28\31]N%d+\30(%d+)')) or 0)
  end
  return n
end

-- Adds `n` bytes (n < 0: takes them) to `plugin`'s task bytes on this shard; a plugin at zero
-- (or below, from records 0.2.0 wrote) leaves `meta`.
local function charge(plugin, n)
  if n == 0 then return end
  local f = 'by:' .. plugin
  if redis.call('HINCRBY', K_META, f, string.format('%d', n)) <= 0 then redis.call('HDEL', K_META, f) end
end

-- The state and `fin` field of a stored record, without decoding the rest.
local function state_and_fin(rec)
  if not rec then return nil, nil end
  return string.match(rec, '^(%a)\t%-?%d+\t%d+\t%d+\t%d+\t(%d*)\t')
end

-- Whether `rec` is running under the claim `token`.
local function holds(rec, token)
  local st, fin = state_and_fin(rec)
  return st == 'r' and fin == token
end

-- The owner in the part of a record from its plugin on (`plugin \t owner \t ...`).
local function owner_of(rest)
  return string.match(rest, '^[^\t]*\t([^\t]*)') or ''
end

local function owner_member(owner, due, id)
  return owner .. '\0' .. string.format('%015d', due) .. '\0' .. id
end

-- A member of `waiting`: a task set aside for its plugin's share (ordered by plugin, then due).
local function wait_member(plugin, due, id)
  return plugin .. '\t' .. string.format('%015d', due) .. '\t' .. id
end

-- A member of `byplugin`: a dead task (score = died at).
local function dead_member(plugin, died, id)
  return plugin .. '\0x\0' .. string.format('%015d', died) .. '\0' .. id
end

-- When a dead task died (its `fin`).
local function died_at(t)
  return tonumber(t.fin) or 0
end
