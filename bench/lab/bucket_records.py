#!/usr/bin/env python3
"""What keeping task records in small hashes costs Redis per claimed task, and what it saves.

W3's target (≤ 150 bytes per pending task) needs records in many small hashes that Redis keeps
as listpacks (~3 bytes of overhead per field) instead of one large hash per shard (~60). This lab
counts, under callgrind (as script_instructions.py does), the instructions a claim-like script
spends per task to read 256 records, and to read and rewrite them (running -> done), with the
records of one shard (100,000 of them) kept:

- flat:   in one hash (today's layout), one HMGET and one HSET per batch;
- hashed: in 8,192 buckets chosen by a hash of the id (computed in Lua): a batch's tasks fall in
          different buckets, so one HGET and one HSET per task;
- window: in buckets of --per-bucket consecutive tasks (as if bucketed by due time, so a claim's
          tasks share a few buckets), one HMGET and one HSET per bucket.

It also prints Redis's memory per record (used_memory's growth over the fill). Usage: bench/lab/bucket_records.py [--per-bucket N]
Needs valgrind, redis-server and the Python package `redis`; about a minute per layout.
"""
import argparse
import random
import tempfile

import script_instructions as si

N, BATCH, BATCHES, HASHED = 100_000, 256, 40, 8192

# A batch's ids grouped by bucket (window): then one HMGET (and one HSET) per bucket.
GROUP = '''local by = {}
for _, id in ipairs(ARGV) do
  local b = math.floor(tonumber(string.sub(id, 2)) / PER)
  local l = by[b]
  if not l then l = {}; by[b] = l end
  l[#l + 1] = id
end
'''
HASH = '''local function bucket(id)
  local h = 0
  for i = 1, #id do h = (h * 31 + string.byte(id, i)) % 1048573 end
  return h % ''' + str(HASHED) + '''
end
'''
SCRIPTS = {
    'flat': ('return #redis.call("HMGET", KEYS[1], unpack(ARGV))',
             '''local r = redis.call("HMGET", KEYS[1], unpack(ARGV))
local w = {}
for i, id in ipairs(ARGV) do w[#w + 1] = id; w[#w + 1] = "d" .. string.sub(r[i], 2) end
return redis.call("HSET", KEYS[1], unpack(w))'''),
    'hashed': (HASH + '''local n = 0
for _, id in ipairs(ARGV) do
  if redis.call("HGET", KEYS[1] .. bucket(id), id) then n = n + 1 end
end
return n''', HASH + '''for _, id in ipairs(ARGV) do
  local k = KEYS[1] .. bucket(id)
  redis.call("HSET", k, id, "d" .. string.sub(redis.call("HGET", k, id), 2))
end
return 1'''),
    'window': (GROUP + '''local n = 0
for b, l in pairs(by) do n = n + #redis.call("HMGET", KEYS[1] .. b, unpack(l)) end
return n''', GROUP + '''for b, l in pairs(by) do
  local r = redis.call("HMGET", KEYS[1] .. b, unpack(l))
  local w = {}
  for i, id in ipairs(l) do w[#w + 1] = id; w[#w + 1] = "d" .. string.sub(r[i], 2) end
  redis.call("HSET", KEYS[1] .. b, unpack(w))
end
return 1'''),
}


def bucket_of(layout, i, per):
    if layout == 'window':
        return i // per
    h = 0
    for c in ('b%d' % i).encode():
        h = (h * 31 + c) % 1048573
    return h % HASHED


def record(i):
    return 's\t%d\t1\t5\t1763856000000\t7\tnoop\t\t\tnull' % (1763942400000 + i)


def run(layout, script, batches, per):
    with tempfile.TemporaryDirectory() as d:
        proc, r, out = si.start(d)
        r.config_set('hash-max-listpack-entries', 128)  # Redis's default (start() sets 0)
        mem0 = r.info('memory')['used_memory']
        p = r.pipeline(transaction=False)
        for i in range(N):
            key = '{et:0}:tasks' if layout == 'flat' else '{et:0}:t:%d' % bucket_of(layout, i, per)
            p.hset(key, 'b%d' % i, record(i))
            if i % 1000 == 999:
                p.execute()
        p.execute()
        mem = r.info('memory')['used_memory'] - mem0
        sha = r.script_load(script.replace('PER', str(per)))
        rnd = random.Random(1)
        for _ in range(batches):
            if layout == 'window':  # a claim's tasks are due together: consecutive here
                start = rnd.randrange(0, N - BATCH)
                ids = ['b%d' % i for i in range(start, start + BATCH)]
            else:
                ids = ['b%d' % i for i in rnd.sample(range(N), BATCH)]
            r.evalsha(sha, 1, '{et:0}:tasks' if layout == 'flat' else '{et:0}:t:', *ids)
        r.shutdown(nosave=True)
        proc.wait()
        return si.instructions(out), mem


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--per-bucket', type=int, default=16, help='tasks per window bucket')
    a = ap.parse_args()
    for layout, (read, rewrite) in SCRIPTS.items():
        for name, script in (('read', read), ('read + rewrite', rewrite)):
            base, mem = run(layout, script, 0, a.per_bucket)
            total, _ = run(layout, script, BATCHES, a.per_bucket)
            print('%-6s %-14s %6d instructions per task, %d bytes per record' % (
                layout, name, (total - base) / (BATCHES * BATCH), mem / N))


if __name__ == '__main__':
    main()
