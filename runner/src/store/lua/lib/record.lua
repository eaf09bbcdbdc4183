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
