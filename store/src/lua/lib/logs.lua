--! part logs
--! needs shard
-- A task's log (`logs`: id -> text): the log lines of its last three attempts, oldest first, at
-- most LOG_BYTES in all. Each attempt's part is `<attempt>\n<level>\t<time>\t<message>...` (the
-- runner writes it, at most LOG_BYTES itself), parts separated by \30 (a byte no line holds).
-- It goes with the record: whatever deletes or replaces a record deletes its log.

local LOG_BYTES = 8192
local LOG_ATTEMPTS = 3

-- Adds attempt `part` to task `id`'s log, dropping the oldest attempts past the limits.
local function keep_log(id, part)
  local old = redis.call('HGET', K_LOGS, id)
  local parts = {}
  if old then
    for p in string.gmatch(old, '[^\30]+') do parts[#parts + 1] = p end
  end
  parts[#parts + 1] = part
  local first, size = #parts, #part
  while first > 1 and #parts - first + 1 < LOG_ATTEMPTS
    and size + 1 + #parts[first - 1] <= LOG_BYTES do
    first = first - 1
    size = size + 1 + #parts[first]
  end
  redis.call('HSET', K_LOGS, id, table.concat(parts, '\30', first, #parts))
end

-- Deletes the logs of `ids` (records deleted or replaced).
local function forget_logs(ids)
  if #ids > 0 and redis.call('EXISTS', K_LOGS) == 1 then call_many('HDEL', K_LOGS, ids) end
end
