--! part blobs
-- Plugin binaries (blobs, by digest) leave Redis with the last version that has them.

-- Deletes the blobs of the digests in `dropped` (a set) that no version still in a plugin's
-- history has. `plugins`: the plugins HASH; the histories and blobs are named from the prefixes.
local function drop_unkept_blobs(dropped, plugins, history_prefix, blob_prefix)
  if next(dropped) == nil then return end
  for _, p in ipairs(redis.call('HKEYS', plugins)) do
    for _, e in ipairs(redis.call('LRANGE', history_prefix .. p, 0, -1)) do
      dropped[cjson.decode(e).digest] = nil
    end
  end
  -- (UNLINK: a binary of many MB is freed in the background)
  for d in pairs(dropped) do redis.call('UNLINK', blob_prefix .. d) end
end
