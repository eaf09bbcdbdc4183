--! part far
--! needs shard record buckets indexes
-- The far tier: scheduled tasks due beyond the runner's horizon (`--far-horizon`), kept packed
-- until the promoter (`far_promote.lua`) moves them into the live tier a lead ahead of their due
-- time. Only a plain task goes there: no owner, no extras (listeners, priority, debounce, trace
-- marks), no dedup window, in a shard without 0.1.0 records. Its record does not exist while it is
-- far; every script that acts on a task by its key first brings it back (`far_fetch`), so each
-- acts on it exactly as on a live task. A far task is counted as scheduled and its bytes charged
-- as a live one's (`count_scheduled`, `charge`): budgets and counts don't see the tiers.
-- Keys, all derived from `tasks` under the shard's hash tag:
--   tasks:fs (ZSET plugin \31 slot -> the slot's start (ms)): the slots that hold far tasks.
--   tasks:f:<plugin>\31<slot> (STRING): the slot's tasks of the plugin, each
--     \30 id \31 due-offset max_attempts age \31 payload
--     or the same starting with \29 instead: a task brought back (`far_fetch`), its bytes kept
--     until the slot is compacted (`far_compact`)
--     (a slot is named by its start in seconds; the id without its plugin; the three numbers in
--     base 64 (`far_digits`): the due time's offset in ms from the slot's start in 3 digits,
--     max_attempts in 2, then the ms from the task's creation to its due time; a payload is JSON:
--     it holds no control character). A slot is as long as
--     its writer chose (`far_slot_ms`: a sixtieth of the horizon, 1 s to a minute), so runners of
--     different horizons share the tier.
--   tasks:fi:<bucket> (HASH subhash -> slot, or slots space-separated when keys share a subhash):
--     where a key's task is. bucket and subhash are cut from the SHA1 of the key (FAR_BUCKETS
--     buckets of a few hundred small entries each: Redis keeps a hash that small packed; a
--     subhash of 23 bits and a slot's start are integers it packs in 5 and 6 bytes).
--   tasks:fc (SET of plugin \31 slot): slots to compact. A script adds to a slot with APPEND
--     and takes a task out by marking it (SETRANGE of one byte), so each call writes (and sends
--     its replicas and the AOF) what it brings, not the slot; APPEND leaves spare room beside a
--     value it grew (Redis's growth policy), and a marked task its bytes, until `far_compact`
--     (the promoter's, every second) writes the slot again whole.

local FAR_BUCKETS = 16384
-- A slot's value grows to at most this many bytes; a task that would pass it stays live. (Every
-- far operation reads and rewrites one slot: this bounds what one costs Redis, ~50 µs.)
local FAR_SLOT_BYTES = 262144

local function far_slots_key() return K_TASKS .. ':fs' end
local function far_list_key(member) return K_TASKS .. ':f:' .. member end
local function far_compact_key() return K_TASKS .. ':fc' end

-- The index bucket's key and the field of `key` (kept for the run: a schedule asks for a key's
-- twice, to look for its far task and to add one).
local far_wheres
on_start[#on_start + 1] = function() far_wheres = {} end
local function far_where(key)
  local w = far_wheres[key]
  if not w then
    local h = redis.sha1hex(key)
    w = { K_TASKS .. ':fi:' .. (tonumber(string.sub(h, 1, 4), 16) % FAR_BUCKETS),
      string.format('%d', tonumber(string.sub(h, 5, 10), 16) % 8388608) }
    far_wheres[key] = w
  end
  return w[1], w[2]
end

-- `n` (a whole number, 0 or more) in base 64, the digits '0' (48) to 'o' (111): printable, none
-- a separator; at least `width` digits.
local function far_digits(n, width)
  local len, top = width, 64 ^ width
  while n >= top do len, top = len + 1, top * 64 end
  local d = {}
  for i = len, 1, -1 do
    d[i] = 48 + n % 64
    n = math.floor(n / 64)
  end
  return string.char(unpack(d))
end

-- The number `far_digits` wrote.
local function far_number(s)
  local n = 0
  for i = 1, #s do n = n * 64 + string.byte(s, i) - 48 end
  return n
end

-- An entry's numbers (after its id's \31): offset, max_attempts, age; see the layout above.
local FAR_NUMBERS = '([0-o][0-o][0-o])([0-o][0-o])([0-o]+)'

-- Whether this shard holds far tasks (read once per run).
local far_there
on_start[#on_start + 1] = function() far_there = nil end
local function far_in_use()
  if far_there == nil then far_there = redis.call('EXISTS', far_slots_key()) == 1 end
  return far_there
end

-- The length of a slot for a horizon (ms): a sixtieth of it, in whole seconds, 1 s to a minute.
local function far_slot_ms(horizon)
  return math.min(60000, math.max(1000, math.floor(horizon / 60000) * 1000))
end

-- Whether a task may go far: plain (see above), due at or past `from` (0: the tier is off).
local function far_eligible(due, owner, last, from)
  return from > 0 and due >= from and owner == '' and not string.find(last, '[\28-\31]')
end

-- What `far_add` staged this run for each slot (member -> its entries, its length with them,
-- its start, its length before), in the order first staged; `far_flush` writes them.
local far_staged, far_order
on_start[#on_start + 1] = function() far_staged, far_order = {}, {} end

-- Adds a task (counted and charged by the caller) to its slot (staged: see `far_flush`); false
-- (nothing written) when the slot is full: the caller keeps the task live.
local function far_add(key, due, max, created, payload, slot_ms)
  local mark = string.find(key, '\31', 1, true)
  local plugin, id = string.sub(key, 1, mark - 1), string.sub(key, mark + 1)
  local start = math.floor(due / slot_ms) * slot_ms
  local slot_s = string.format('%d', start / 1000)
  local member = plugin .. '\31' .. slot_s
  local st = far_staged[member]
  if not st then
    local len = redis.call('STRLEN', far_list_key(member))
    st = { len = len, was = len, start = start }
    far_staged[member] = st
    far_order[#far_order + 1] = member
  end
  local age = due - tonumber(created)
  if st.len >= FAR_SLOT_BYTES or age < 0 or tonumber(max) >= 4096 then return false end
  local entry = '\30' .. id .. '\31' .. far_digits(due - start, 3) .. far_digits(tonumber(max), 2)
    .. far_digits(age, 1) .. '\31' .. payload
  st[#st + 1] = entry
  st.len = st.len + #entry
  local bucket, field = far_where(key)
  if redis.call('HSETNX', bucket, field, slot_s) == 0 then
    -- a key sharing the field has a far task too
    redis.call('HSET', bucket, field, redis.call('HGET', bucket, field) .. ' ' .. slot_s)
  end
  far_there = true
  return true
end

-- Writes what `far_add` staged: one APPEND a slot per run; a slot that was there before is to
-- be compacted (an APPEND to a new key makes a value as long as it is).
local function far_flush()
  for _, member in ipairs(far_order) do
    local st = far_staged[member]
    redis.call('APPEND', far_list_key(member), table.concat(st))
    if st.was > 0 then redis.call('SADD', far_compact_key(), member) end
    redis.call('ZADD', far_slots_key(), 'NX', string.format('%d', st.start), member)
  end
  far_staged, far_order = {}, {}
end

-- Takes one `slot_s` out of the index entry of `key`.
local function far_unindex(key, slot_s)
  local bucket, field = far_where(key)
  local was = redis.call('HGET', bucket, field)
  if not was then return end
  if was == slot_s then redis.call('HDEL', bucket, field); return end
  local rest, dropped = {}, false
  for s in string.gmatch(was, '%S+') do
    if s == slot_s and not dropped then dropped = true else rest[#rest + 1] = s end
  end
  if #rest == 0 then redis.call('HDEL', bucket, field)
  else redis.call('HSET', bucket, field, table.concat(rest, ' ')) end
end

-- The due time and live record of a far entry's fields (as written: see the layout above).
local function far_record(plugin, slot, off, max, age, payload)
  local due = slot * 1000 + far_number(off)
  return due, string.format('s\t%d\t0\t%d\t%d\t\t', due, far_number(max), due - far_number(age))
    .. plugin .. '\t\t\t' .. payload
end

-- Writes a task brought back from the far tier as a live scheduled one: its record and its due
-- bucket (or `parked`); it was counted as scheduled when it went far.
local function far_live(key, rec, due)
  redis.call('HSET', K_TASKS, key, rec)
  local plugin = string.sub(key, 1, string.find(key, '\31', 1, true) - 1)
  if is_held(plugin, '') then redis.call('ZADD', K_PARKED, due, key)
  else due_add({ string.format('%d', due), key }) end
end

-- The far entry of `key`: its slot's member and start, where the entry starts in the slot's
-- value, its due time and the record it will have; nil when the key has no far task.
local function far_find(key)
  if #far_order > 0 then far_flush() end
  if not far_in_use() then return nil end
  local mark = string.find(key, '\31', 1, true)
  if not mark then return nil end
  local bucket, field = far_where(key)
  local where = redis.call('HGET', bucket, field)
  if not where then return nil end
  local plugin, id = string.sub(key, 1, mark - 1), string.sub(key, mark + 1)
  local head = '\30' .. id .. '\31'
  for slot_s in string.gmatch(where, '%S+') do
    local member = plugin .. '\31' .. slot_s
    local blob = redis.call('GET', far_list_key(member))
    local s = blob and string.find(blob, head, 1, true)
    if s then
      local e = string.find(blob, '[\29\30]', s + 1) or #blob + 1
      local off, max, age, payload = string.match(string.sub(blob, s + #head, e - 1),
        '^' .. FAR_NUMBERS .. '\31(.*)$')
      local due, record = far_record(plugin, tonumber(slot_s), off, max, age, payload)
      return { member = member, slot_s = slot_s, s = s, due = due, record = record }
    end
  end
  return nil
end

-- Brings the far task stored under `key` into the live tier; returns whether there was one.
-- Its entry in the slot is marked (one byte written), the slot left to `far_compact`.
-- Bound: the key's index entry and the slot(s) it names (a GET of each).
local function far_fetch(key)
  local f = far_find(key)
  if not f then return false end
  redis.call('SETRANGE', far_list_key(f.member), f.s - 1, '\29')
  redis.call('SADD', far_compact_key(), f.member)
  far_unindex(key, f.slot_s)
  far_live(key, f.record, f.due)
  return true
end

-- Moves every task of the far slot `member` (plugin \31 slot) into the live tier. Returns how
-- many moved and the earliest due among them.
-- Bound: one slot (FAR_SLOT_BYTES).
local function far_promote_slot(member)
  local mark = string.find(member, '\31', 1, true)
  local plugin, slot_s = string.sub(member, 1, mark - 1), string.sub(member, mark + 1)
  local slot = tonumber(slot_s)
  local lk = far_list_key(member)
  local blob = redis.call('GET', lk) or ''
  local records, dues, parked = {}, {}, {}
  local held = is_held(plugin, '')
  local moved, earliest = 0, nil
  for id, off, max, age, payload in string.gmatch(blob, '\30([^\31]*)\31' .. FAR_NUMBERS .. '\31([^\29\30]*)') do
    local key = plugin .. '\31' .. id
    local due, record = far_record(plugin, slot, off, max, age, payload)
    push(records, key, record)
    if held then push(parked, string.format('%d', due), key)
    else push(dues, string.format('%d', due), key) end
    far_unindex(key, slot_s)
    if not earliest or due < earliest then earliest = due end
    moved = moved + 1
  end
  call_many('HSET', K_TASKS, records)
  due_add(dues)
  call_many('ZADD', K_PARKED, parked)
  redis.call('DEL', lk)
  redis.call('ZREM', far_slots_key(), member)
  redis.call('SREM', far_compact_key(), member)
  return moved, earliest
end

-- Moves the far tasks of the slots starting at or before `upto` into the live tier, earliest slot
-- first, whole slots until `limit` tasks have moved. Returns how many moved and the earliest due
-- among them.
-- Bound: `limit` tasks and one slot more (FAR_SLOT_BYTES).
local function far_promote(upto, limit)
  local moved, earliest = 0, nil
  while moved < limit do
    local first = redis.call('ZRANGEBYSCORE', far_slots_key(), '-inf', string.format('%d', upto), 'LIMIT', '0', '1')
    if #first == 0 then break end
    local n, e = far_promote_slot(first[1])
    moved = moved + n
    if e and (not earliest or e < earliest) then earliest = e end
  end
  return moved, earliest
end

-- Writes slots of tasks:fc again with their tasks only (see the layout above), as long as they
-- are; a slot left with none goes. Returns how many slots are still to compact.
-- Bound: `budget` bytes of slots and one slot more (FAR_SLOT_BYTES).
local function far_compact(budget)
  local done = 0
  while done < budget do
    local member = redis.call('SPOP', far_compact_key())
    if not member then break end
    local lk = far_list_key(member)
    local blob = redis.call('GET', lk)
    if blob then
      done = done + #blob
      local kept = string.gsub(blob, '\29[^\29\30]*', '')
      if kept == '' then
        redis.call('DEL', lk)
        redis.call('ZREM', far_slots_key(), member)
      else
        redis.call('SET', lk, kept)
      end
    end
  end
  return redis.call('SCARD', far_compact_key())
end
