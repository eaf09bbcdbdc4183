#!/usr/bin/env python3
"""What layout 5's migration (the one `due` ZSET per shard into due buckets) costs, once.

Schedules --tasks tasks (due 1 ms apart, over 16 shards, 500 per script) with the schedule script
of the main before the due buckets, then runs this worktree's `migrate.lua` on every shard until
it is done, as `Store::open` does. Prints the wall time, Redis CPU per task (INFO cpu) and memory
per task before and after. Usage: bench/lab/migrate_buckets.py [--tasks N]
Needs redis-server and the Python package `redis`; about 10 s at the default 1,000,000 tasks.
"""
import argparse
import subprocess
import tempfile
import time

import redis

import script_instructions as si

BEFORE_BUCKETS = 'd704c2f83fa7d8e9d55cce66a5d52b1a2b9a9754'
FAR = 1_800_000_000_000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--tasks', type=int, default=1_000_000)
    n = ap.parse_args().tasks
    with tempfile.TemporaryDirectory() as d:
        port = si.free_port()
        proc = subprocess.Popen(['redis-server', '--port', str(port), '--dir', d, '--save', '',
                                 '--appendonly', 'yes', '--appendfsync', 'everysec'],
                                stdout=subprocess.DEVNULL)
        r = redis.Redis(port=port)
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        old = r.script_load(si.source(BEFORE_BUCKETS, 'schedule'))
        migrate = r.script_load(si.source('worktree', 'migrate'))
        for shard in range(si.SHARDS):
            r.hset('{et:%d}:meta' % shard, 'layout', '4')
            ids = ['p%d' % i for i in range(shard, n, si.SHARDS)]
            p = r.pipeline(transaction=False)
            for j in range(0, len(ids), 500):
                batch = ids[j:j + 500]
                args = ['', shard, 'upsert', len(batch), 5, 'noop', 0, 0]
                for i in batch:
                    args += [i, FAR + int(i[1:]), '', 'null']
                done = ['{et:%d}:done:%s' % (shard, i) for i in batch]
                p.evalsha(old, 15 + len(batch), *si.keys(shard, 15), *done, *args)
            p.execute()
        cpu = lambda: (lambda c: c['used_cpu_sys'] + c['used_cpu_user'])(r.info('cpu'))
        m0, c0, t0 = r.info('memory')['used_memory'], cpu(), time.time()
        for shard in range(si.SHARDS):
            cursor = '0'
            while True:
                cursor = r.evalsha(migrate, 16, *si.keys(shard, 16), '5', cursor, 500).decode()
                if cursor == '0':
                    break
        t1, c1, m1 = time.time(), cpu(), r.info('memory')['used_memory']
        left = sum(r.zcard('{et:%d}:due' % s) for s in range(si.SHARDS))
        buckets = sum(r.zcard('{et:%d}:duex' % s) for s in range(si.SHARDS))
        print('migrated %d tasks in %.1f s, Redis CPU %.2f us per task; %.0f -> %.0f bytes per '
              'task; %d left in due, %d buckets' % (n, t1 - t0, (c1 - c0) / n * 1e6, m0 / n,
                                                    m1 / n, left, buckets))
        r.shutdown(nosave=True)
        proc.wait()


if __name__ == '__main__':
    main()
