#!lua flags=allow-oom
--! needs extras
-- Lets listeners go (U messages): their tasks ended or an event of another topic reached them.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: U messages (see `extras`).
-- Returns how many listeners were let go.
-- Bound: the U messages of the call, each an inline list of at most LISTEN_INLINE listeners or
--  one HDEL (see `extras`).
local gone = 0
for i = 1, #ARGV do
  local topic, key, task, stamp = string.match(ARGV[i], '^U([^\30]*)\30([^\30]*)\30([^\30]*)\30(.*)$')
  if topic then
    local field = topic .. '\31' .. key
    local ls = redis.call('HGET', K_LISTENERS, field)
    if ls and inline_count(ls) > LISTEN_INLINE then
      -- (0.2.0's lists had no bound: such a list moves to its hash, once)
      spill(field, ls)
      ls = nil
    end
    gone = gone + redis.call('HDEL', spill_key(field), task .. '\30' .. stamp)
    if ls then
      local keep = {}
      for l in string.gmatch(ls, '[^\29]+') do
        if string.sub(l, 2) == '\30' .. task .. '\30' .. stamp then gone = gone + 1
        else keep[#keep + 1] = l end
      end
      if #keep == 0 then redis.call('HDEL', K_LISTENERS, field)
      else redis.call('HSET', K_LISTENERS, field, table.concat(keep, '\29')) end
    end
  end
end
return gone
