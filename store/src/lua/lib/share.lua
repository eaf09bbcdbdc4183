--! part share
--! needs shard record indexes
-- Fair share between plugins, as a claim sees it. The claiming runner says how many tasks it
-- holds of each plugin (`held`); the claim gives each of its places in turn to the plugin with
-- the fewest held (its earliest due task), so a plugin alone still fills every place. Where one
-- plugin holds much of the runner, the claim walks past its own size to find other plugins'
-- tasks behind that plugin's backlog; due tasks it walked past and did not take are set aside:
-- out of the buckets into `parked` and `waiting` (still scheduled, no attempt used), where every
-- runner's next claim looks first, each plugin's earliest first. A runner full of one plugin's
-- tasks claims into a little headroom for the others: those places go only to plugins holding
-- less than their part.

-- Most plugins with tasks waiting that one claim looks at.
local MAX_WAITING_PLUGINS = 256

-- 'p1\tn1\tw1\tp2\tn2\tw2...' as {p1 = n1, ...}, {p1 = w1, ...}, and the most held.
local function parse_held(s)
  local held, weights, most = {}, {}, 0
  for p, n, w in string.gmatch(s, '([^\t]+)\t(%d+)\t(%d+)\t') do
    held[p], weights[p] = tonumber(n), math.max(tonumber(w), 1)
    most = math.max(most, held[p])
  end
  return held, weights, most
end

-- Whether a plugin holding `n` tasks is not crowding the runner: at most `part`, or under half
-- of what the plugin holding the most holds (headroom is for such plugins).
local function not_crowding(n, part, most)
  return n <= part or n * 2 < most
end
-- The plugins with tasks here that may have one due at `now` (their head, see
-- `count_scheduled`, has come or is unknown), and the earliest head of the other plugins not
-- crowding the runner (nil: none): until then, no plugin but those may take a place here.
local function due_plugins(now, held, part, most)
  local plugins = redis.call('HKEYS', K_SCHEDULED)
  local due, later = {}, nil
  for i = 1, #plugins, 1000 do
    local fields = {}
    for j = i, math.min(i + 999, #plugins) do fields[#fields + 1] = 'hd:' .. plugins[j] end
    local heads = redis.call('HMGET', K_META, unpack(fields))
    for j, h in ipairs(heads) do
      local p = plugins[i + j - 1]
      h = tonumber(h)
      if not h or h <= now then
        due[#due + 1] = p
      elseif not_crowding(held[p] or 0, part, most) and (not later or h < later) then
        later = h
      end
    end
  end
  return due, later
end

-- Up to `limit` waiting tasks due at `now` of each plugin not paused, earliest first per
-- plugin: a list of {due, id, plugin, member}.
local function waiting_due(now, limit)
  local out = {}
  if redis.call('EXISTS', K_WAITING) == 0 then return out end
  local from = '-'
  local till = string.format('%015d', now + 1)
  for _ = 1, MAX_WAITING_PLUGINS do
    local first = redis.call('ZRANGEBYLEX', K_WAITING, from, '+', 'LIMIT', '0', '1')[1]
    if not first then break end
    local plugin = string.match(first, '^([^\t]*)\t')
    if not is_paused(plugin) then
      local got = redis.call('ZRANGEBYLEX', K_WAITING, '[' .. plugin .. '\t',
        '(' .. plugin .. '\t' .. till, 'LIMIT', '0', string.format('%d', limit))
      for _, m in ipairs(got) do
        local due, id = string.match(m, '^[^\t]*\t(%d+)\t(.*)$')
        out[#out + 1] = { tonumber(due), id, plugin, m }
      end
    end
    -- the next plugin's members sort after every member of this one
    from = '(' .. plugin .. '\t\255'
  end
  return out
end

-- Marks up to `limit` of the candidates (in due order; each {due, plugin, ...}) chosen, one
-- at a time to the plugin holding the fewest tasks of the claiming runner for its weight
-- (`held` / `weights`, counting those chosen), its earliest; the earliest due among equals.
-- The last `headroom` places go only to plugins not crowding the runner when the claim began. Returns plugin -> {n: how many it holds with those chosen, under:
-- whether it may take headroom}.
local function choose(cands, held, weights, most, limit, headroom, part)
  local queues, plugins = {}, {}
  for _, c in ipairs(cands) do
    local q = queues[c.plugin]
    if not q then
      q = { at = 1, n = held[c.plugin] or 0, w = weights[c.plugin] or 1 }
      q.under = not_crowding(q.n, part, most)
      queues[c.plugin] = q
      plugins[#plugins + 1] = q
    end
    q[#q + 1] = c
  end
  if #plugins == 1 and headroom == 0 then
    for i = 1, math.min(limit, #cands) do cands[i].chosen = true end
    plugins[1].n = plugins[1].n + math.min(limit, #cands)
    return queues
  end
  for place = 1, limit do
    local best
    for _, q in ipairs(plugins) do
      local c = q[q.at]
      if c and (place <= limit - headroom or q.under) and (not best
          or q.n * best.w < best.n * q.w
          or (q.n * best.w == best.n * q.w and c.due < best[best.at].due)) then
        best = q
      end
    end
    if not best then return queues end
    best[best.at].chosen = true
    best.at = best.at + 1
    best.n = best.n + 1
  end
  return queues
end
