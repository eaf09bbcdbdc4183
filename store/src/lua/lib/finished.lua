--! part finished
--! needs shard record logs
-- The finish log: each finish script that records tasks done adds one entry to `finished`
-- ('<time>\t<id>\t<id>...' -> time). An id listed is done at that time only while its record
-- says so (done, `fin` that time): it may have been scheduled again since.

-- Deletes done records that finished before `before` (the retention window): the tasks of up to
-- two `finished` entries, so each finish script, adding one, removes at least as many as it
-- adds. The walk starts at the lowest scores, so the entries read are the first ranks.
local function forget_done(before)
  local cut = '(' .. string.format('%d', before)
  local logs = redis.call('ZRANGEBYSCORE', K_FINISHED, '-inf', cut, 'LIMIT', '0', '2')
  if #logs == 0 then return end
  local ids = {}
  for _, entry in ipairs(logs) do
    for id in string.gmatch(string.match(entry, '^[^\t]*\t(.*)$') or '', '[^\t]+') do
      ids[#ids + 1] = id
    end
  end
  local recs, gone, bytes = records_of(ids), {}, {}
  for i, id in ipairs(ids) do
    -- still done, and then (not run again since and done later, nor replaced)
    local rec = recs[i]
    local st, fin, plugin, at
    if rec then
      st, fin, plugin, at = string.match(rec, '^(%a)\t%-?%d+\t%d+\t%d+\t%d+\t(%d*)\t([^\t]*)\t[^\t]*\t[^\t]*\t()')
    end
    if st == 'd' and (tonumber(fin) or 0) < before then
      gone[#gone + 1] = id
      bytes[plugin] = (bytes[plugin] or 0) + weight(rec, at)
      -- a debounced one's window (see `extras`)
      if string.find(recs[i], '\28', 1, true) then redis.call('UNLINK', window_key(id)) end
    end
  end
  call_many('HDEL', K_TASKS, gone)
  for plugin, n in pairs(bytes) do charge(plugin, -n) end
  forget_logs(gone)
  redis.call('ZREMRANGEBYRANK', K_FINISHED, 0, #logs - 1)
end

-- Logs `ids` as recorded done at `now` by this script: one `finished` entry. (Its first field is
-- the time, which readers skip. Two runs in the same ms that recorded the same ids in the same
-- order make one entry, which lists them done at that time all the same.)
local function log_done(ids, now)
  if #ids == 0 then return end
  local at = string.format('%d', now)
  redis.call('ZADD', K_FINISHED, at, at .. '\t' .. table.concat(ids, '\t'))
end
