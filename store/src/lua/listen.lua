#!lua
--! needs extras
-- Registers listeners in this shard (the event shard of their topics and keys): L messages.
-- KEYS: the shard's keys (the `shard` part).
-- ARGV: L messages (see `extras`).
-- A listener whose event is stored here since its `since` matches at once (a D message
-- returned, not registered); else it joins `listeners` (once, however often it is sent).
-- Returns {D message...}.
-- Bound: the L messages of the call (one schedule call's listeners, at most 8 per task), each an
--  inline list of at most LISTEN_INLINE listeners or one HSET (see `extras`).
local out = {}
for i = 1, #ARGV do
  local th, task, stamp, topic, key, since = string.match(ARGV[i],
    '^L(.)\30([^\30]*)\30([^\30]*)\30([^\30]*)\30([^\30]*)\30(%-?%d+)$')
  if th then
    local field = topic .. '\31' .. key
    local e = redis.call('HGET', K_EVENTS, field)
    local at, ev = nil, nil
    if e then
      local from
      at, from = string.match(e, '^(%d+)\30()')
      if at then ev = string.sub(e, from) end
    end
    if at and tonumber(at) >= tonumber(since) then
      out[#out + 1] = 'D' .. th .. '\30' .. task .. '\30' .. stamp .. '\30' .. topic .. '\30' .. key .. '\30' .. ev
    else
      local me = th .. '\30' .. task .. '\30' .. stamp
      local sk = spill_key(field)
      if redis.call('EXISTS', sk) == 1 then
        redis.call('HSET', sk, task .. '\30' .. stamp, th)
      else
        local ls = redis.call('HGET', K_LISTENERS, field)
        if not ls then
          redis.call('HSET', K_LISTENERS, field, me)
        elseif string.find('\29' .. ls .. '\29', '\29' .. me .. '\29', 1, true) then
          -- listening already
        elseif inline_count(ls) < LISTEN_INLINE then
          redis.call('HSET', K_LISTENERS, field, ls .. '\29' .. me)
        else
          spill(field, ls)
          redis.call('HSET', sk, task .. '\30' .. stamp, th)
        end
      end
    end
  end
end
return out
