#!lua
--! needs blobs
-- Stores an uploaded plugin version and makes it current (or keeps it as a candidate); announces
-- it. The plugin keeps its
-- newest `keep` versions: older ones leave its history, and their bytes leave Redis unless a
-- version still kept (of any plugin) has the same bytes.
-- KEYS: plugins (HASH name -> current JSON), history (LIST, newest first), blob, seq (HASH),
-- staging (STRING: the uploaded bytes, sent before in pieces; taken as the blob, or dropped).
-- (The other plugins' histories and the blobs to drop are named from ARGV's prefixes, under the
-- same hash tag.)
-- ARGV: name, digest, size, uploaded_at, '' (0.2.0 sent the bytes here), channel, keep,
-- history key prefix, blob key prefix,
-- uploaded_by (the uploading key's id; '' for none), candidate ('1': stored, not made current,
-- nor announced, unless the plugin has no current version).
-- Returns {version, created (1) or 0 when these bytes are already the current version (or, for a
-- candidate, any version in the history)}. Bytes of a candidate uploaded to be made current
-- make that candidate current (1).
-- Bound: the plugin's history (at most `--keep-versions`); when a version leaves it, every plugin's
--  history is read to keep the bytes still used (plugins × `--keep-versions`). The bytes are
--  never in the call: a rename takes them (or an UNLINK drops them), whatever their size.
local name, digest, size, at, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6]
local keep, history_prefix, blob_prefix = tonumber(ARGV[7]), ARGV[8], ARGV[9]
-- the bytes: the blob of a digest never changes, so pieces of bytes already stored just go
local staged = redis.call('STRLEN', KEYS[5])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('UNLINK', KEYS[5])
elseif staged ~= tonumber(size) then
  redis.call('UNLINK', KEYS[5])
  return redis.error_reply('the plugin bytes sent before the store were ' .. staged ..
    ' bytes, not ' .. size .. ' (they expire after ten minutes): upload it again')
else
  redis.call('RENAME', KEYS[5], KEYS[3])
  redis.call('PERSIST', KEYS[3])
end
local cur = redis.call('HGET', KEYS[1], name)
local candidate = ARGV[11] == '1' and cur ~= false
local previous
if cur then
  local v = cjson.decode(cur)
  if v.digest == digest then return { v.version, 0 } end
  previous = v.version
end
-- the current entry is its history entry with `previous`: the version it replaced, which a
-- rollback makes current again
local function current(v)
  v.previous = previous
  return cjson.encode(v)
end
-- bytes already in the history: a candidate upload names their version; an upload to make
-- current promotes a candidate of them in place
for i, e in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  local v = cjson.decode(e)
  if v.digest == digest then
    if candidate then return { v.version, 0 } end
    if v.candidate then
      v.candidate = nil
      e = cjson.encode(v)
      redis.call('LSET', KEYS[2], i - 1, e)
      redis.call('HSET', KEYS[1], name, current(v))
      redis.call('PUBLISH', channel, name)
      return { v.version, 1 }
    end
  end
end
local version = redis.call('HINCRBY', KEYS[4], name, 1)
local uploaded_by = ARGV[10]
if uploaded_by == '' then uploaded_by = nil end
local fields = { name = name, version = version, digest = digest, size = tonumber(size),
  uploaded_at = tonumber(at), uploaded_by = uploaded_by, candidate = candidate or nil }
redis.call('LPUSH', KEYS[2], cjson.encode(fields))
if not candidate then redis.call('HSET', KEYS[1], name, current(fields)) end
local dropped = {}
while redis.call('LLEN', KEYS[2]) > keep do
  dropped[cjson.decode(redis.call('RPOP', KEYS[2])).digest] = true
end
drop_unkept_blobs(dropped, KEYS[1], history_prefix, blob_prefix)
if not candidate then redis.call('PUBLISH', channel, name) end
return { version, 1 }
