#!/usr/bin/env python3
"""Instructions Redis spends per task in eggtimer's schedule, claim and finish scripts.

CPU time on a shared VM varies by ±20% between runs; instruction counts under callgrind do not.
This lab runs a private redis-server under `valgrind --tool=callgrind` (collecting only while
Redis reads and runs commands, flushes the AOF and writes replies, so idle time and its cron do
not count), drives it with W0's and W2's shapes, and prints instructions per task for each step:

- schedule: batches of 62 tasks per shard script (W0: batches of 1,000 over 16 shards);
- claim: claims of 256 (`--claim N`: W1 claims a task or two); finish: the outcomes (`done`) of
  what each claim returned.

The `tasks` hash is kept out of its listpack encoding, as in a shard holding thousands of tasks;
sorted sets are at Redis's default (the due buckets of layout 5 are listpacks, the one `due` of
earlier layouts holds thousands per shard and is not). All tasks are due at one instant (W0, W2),
or with `--spread` one ms apart in id order (W1, W3: the claims cross buckets). Each figure is
(run with the steps so far − run with one step fewer) / tasks.

Usage: bench/lab/script_instructions.py [--tasks N] [--claim N] [--spread] [--keep DIR] REV [REV ...]
  REV: a git revision whose scripts to measure (`':/^Release 0.1.0'` names that release's
  commit), or `worktree` for the files on disk.
Needs valgrind, redis-server and the Python package `redis` (pip install redis). Each revision
takes about a minute at the default 8,000 tasks. It knows three ways scripts were put together:
0.1.0's prelude, the parts of lua/lib/ run with EVALSHA (builds between 0.1.0 and 0.2.0), and
the same parts loaded as a Redis function library and run with FCALL (0.2.0: task ids stored as
`<plugin>\x1f<id>`, a claim's reply with nine values before its tasks, a finish's logs before
its outcomes). It knows the scripts' argument layouts before and after commit "store: outcomes
and schedule settings sent once per run": `--layout runs|per-task` picks one for revisions it
can't tell. `--keep DIR` keeps callgrind's output of each run for callgrind_annotate.
"""
import argparse
import os
import re
import socket
import subprocess
import tempfile
import time

import redis

ROOT = subprocess.run(['git', 'rev-parse', '--show-toplevel'], capture_output=True, text=True,
                      check=True).stdout.strip()
LUA = 'store/src/lua/'
SCRIPTS_RS = 'store/src/scripts.rs'
SHARDS = 16
PER_SCRIPT = 62
# The shard keys, in the order the scripts take them: 0.1.0's (a prelude prepended to each script)
# and today's (the parts of lua/lib/ that a script names).
KEY_NAMES = {
    'prelude': ['due', 'tasks', 'inflight', 'dead', 'byowner', 'meta', 'parked', 'byplugin',
                'unique', 'recent', 'rerun', 'leases', 'batches', 'finished', 'scheduled', 'duex'],
    'parts': ['tasks', 'dead', 'byowner', 'meta', 'parked', 'byplugin', 'unique', 'rerun',
              'leases', 'batches', 'finished', 'scheduled', 'duex'],
}
PARTS = ['shard', 'record', 'buckets', 'indexes', 'claims', 'finished', 'walk']


def commit(rev):
    """The commit a revision names (`worktree` stays itself)."""
    if rev == 'worktree':
        return rev
    return subprocess.run(['git', '-C', ROOT, 'rev-parse', '--verify', rev],
                          capture_output=True, text=True, check=True).stdout.strip()


def read_path(rev, path):
    if rev == 'worktree':
        return open(os.path.join(ROOT, path)).read()
    return subprocess.run(['git', '-C', ROOT, 'show', '%s:%s' % (rev, path)],
                          capture_output=True, text=True, check=True).stdout


def read(rev, f):
    return read_path(rev, LUA + f)


def layout_of(rev):
    try:
        read(rev, 'lib/shard.lua')
    except (subprocess.CalledProcessError, FileNotFoundError):
        return 'prelude'
    if 'register_function' in read_path(rev, SCRIPTS_RS):
        return 'functions'
    return 'parts'


def needs(text):
    for line in text.split('\n')[:3]:
        if line.startswith('--! needs '):
            return line[len('--! needs '):].split()
    return []


def parts_of(rev):
    """The parts of lua/lib/ in the order scripts carry them (scripts.rs's PARTS)."""
    return (re.findall(r'\("(\w+)", include_str!\("lua/lib/', read_path(rev, SCRIPTS_RS))
            or PARTS)


def assembled(rev, name):
    """A script's first line, the parts it needs, what a run does first, and its own text (as
    scripts.rs puts them together)."""
    body = read(rev, name + '.lua')
    if layout_of(rev) == 'prelude':
        return None, read(rev, 'prelude.lua') + '\n', '', body
    want, todo = set(), needs(body)
    while todo:
        part = todo.pop()
        if part not in want:
            want.add(part)
            todo += needs(read(rev, 'lib/%s.lua' % part))
    parts = ''.join(read(rev, 'lib/%s.lua' % p) + '\n' for p in parts_of(rev) if p in want)
    shebang = None
    if body.startswith('#!'):
        shebang, body = body.split('\n', 1)
    if layout_of(rev) == 'parts':
        return shebang, parts, '', body
    return shebang, parts, 'start(KEYS)\n' if 'shard' in want else '', body


def source(rev, name):
    """A script's text, to run with EVALSHA (the prelude and parts layouts)."""
    shebang, parts, prologue, body = assembled(rev, name)
    return (shebang + '\n' if shebang else '') + parts + prologue + body


def library(rev, name):
    """A script as the function library of one function that the runner loads: (its name, the
    library's text)."""
    shebang, parts, prologue, body = assembled(rev, name)
    fname = 'lab_' + name
    flags = ', '.join("'%s'" % f for w in shebang.split() if w.startswith('flags=')
                      for f in w[len('flags='):].split(','))
    return fname, ('#!lua name=%s\n%sredis.register_function{function_name = \'%s\', '
                   'flags = {%s}, callback = function(KEYS, ARGV)\n%s%s\nend}\n'
                   % (fname, parts, fname, flags, prologue, body))


def shapes(rev, layout):
    """What the revision's scripts take and answer, read from their text: the values before the
    tasks in a claim's reply, whether a claim takes fair share's arguments, whether a finish takes
    logs before its outcomes, whether a task's key is `<plugin>\\x1f<id>`."""
    claim = read(rev, 'claim.lua')
    fixed = re.search(r'local out = \{([^}]*)\}', claim)
    return {
        'fixed': len(fixed.group(1).split(',')) if fixed and layout == 'runs' else
                 (5 if layout == 'runs' else 4),
        'share': 'parse_held(ARGV' in claim,
        'logs': 'number of logs' in read(rev, 'finish.lua'),
        'plugin_key': 'x1f' in read(rev, 'schedule.lua'),
    }


def keys(rev, shard):
    names = KEY_NAMES['prelude']
    if layout_of(rev) != 'prelude':
        # the shard part's header lists them (`--   KEYS[1] tasks (...)`), in later builds
        names = (re.findall(r'^--\s+KEYS\[\d+\] (\w+)', read(rev, 'lib/shard.lua'), re.M)
                 or KEY_NAMES['parts'])
    return ['{et:%d}:%s' % (shard, k) for k in names]


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(workdir):
    port = free_port()
    out = os.path.join(workdir, 'callgrind.out')
    proc = subprocess.Popen(
        ['valgrind', '--tool=callgrind', '--callgrind-out-file=' + out,
         '--toggle-collect=processInputBuffer', '--toggle-collect=flushAppendOnlyFile',
         '--toggle-collect=handleClientsWithPendingWritesUsingThreads',
         'redis-server', '--port', str(port), '--dir', workdir, '--appendonly', 'yes',
         '--appendfsync', 'everysec', '--save', ''],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    deadline = time.time() + 60
    while True:
        try:
            r.ping()
            break
        except redis.ConnectionError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    # a shard's `tasks` as in production (a large hash); ZSETs at Redis's default, so the due
    # buckets are listpacks and the one `due` of earlier layouts (thousands per shard) is not
    r.config_set('hash-max-listpack-entries', 0)
    return proc, r, out


def instructions(out):
    for line in open(out):
        if line.startswith(('summary:', 'totals:')):
            return int(line.split()[1])
    raise RuntimeError('no totals in ' + out)


def run(rev, layout, tasks, steps, claim=256, keep=None, spread=False):
    with tempfile.TemporaryDirectory() as d:
        proc, r, out = start(d)
        # each script called as the revision's runner calls it: FCALL of a function, or EVALSHA
        call = {}
        for n in ('schedule', 'claim', 'finish'):
            if layout_of(rev) == 'functions':
                fname, text = library(rev, n)
                r.function_load(text)
                call[n] = (lambda f: lambda nkeys, *a: r.fcall(f, nkeys, *a))(fname)
            else:
                sha = r.script_load(source(rev, n))
                call[n] = (lambda s: lambda nkeys, *a: r.evalsha(s, nkeys, *a))(sha)
        ks = lambda shard: keys(rev, shard)
        # (0.1.0's schedule takes each task's done-record key of the layouts before it)
        old = layout_of(rev) == 'prelude'
        ids = ['b%d' % i for i in range(tasks)]
        shape = shapes(rev, layout)
        # a task's key: its plugin, \x1f, its id (0.2.0); the bare id before
        key = (lambda i: 'noop\x1f' + i) if shape['plugin_key'] else (lambda i: i)
        if 'schedule' in steps:
            for shard in range(SHARDS):
                mine = [i for i in ids if sum(map(ord, i)) % SHARDS == shard]
                for j in range(0, len(mine), PER_SCRIPT):
                    batch = mine[j:j + PER_SCRIPT]
                    args = ['', shard, 'upsert']
                    due = (lambda i: 1000 + int(i[1:])) if spread else (lambda i: 1000)
                    if layout == 'runs':
                        args += [len(batch), 5, 'noop', 0, 0]
                        for i in batch:
                            args += [key(i), due(i), '', 'null']
                    else:
                        for i in batch:
                            args += [i, due(i), 5, 'noop', '', 'null', 0, 0]
                    done_keys = ['{et:%d}:done:%s' % (shard, i) for i in batch] if old else []
                    call['schedule'](len(ks(shard)) + len(done_keys), *ks(shard), *done_keys,
                                     *args)
        if 'claim' in steps:
            for shard in range(SHARDS):
                while True:
                    # limit, lease_ms, then fair share's held (none), extra, headroom, part
                    share = ['', 0, 0, 0] if shape['share'] else []
                    reply = call['claim'](len(ks(shard)), *ks(shard), claim, 5000, *share)
                    got, step = reply[shape['fixed']:], 2 if layout == 'runs' else 3
                    if not got:
                        break
                    token = reply[3]
                    claimed = got[0::step]
                    args = ['', shard, 3600000]
                    if layout == 'runs':
                        # (no logs,) then one run of outcomes
                        args += [0] if shape['logs'] else []
                        args += ['done', token, 0, '', len(claimed)] + claimed
                    else:
                        for i in claimed:
                            args += [i, token, 'done', 0, '']
                    if 'finish' in steps:
                        call['finish'](len(ks(shard)), *ks(shard), *args)
        r.shutdown(nosave=True)
        proc.wait()
        if keep:
            subprocess.run(['cp', out, keep], check=True)
        return instructions(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('revs', nargs='+')
    ap.add_argument('--tasks', type=int, default=8000)
    ap.add_argument('--layout', choices=['runs', 'per-task'])
    ap.add_argument('--claim', type=int, default=256,
                    help='tasks per claim (W2: 256; W1 claims a task or two)')
    ap.add_argument('--spread', action='store_true',
                    help='tasks due one ms apart (W1, W3) instead of at one instant (W0, W2)')
    ap.add_argument('--keep', metavar='DIR',
                    help='keep each run\'s callgrind output in DIR (for callgrind_annotate)')
    a = ap.parse_args()
    for name in a.revs:
        rev = commit(name)
        layout = a.layout or ('runs' if 'runs of tasks' in source(rev, 'finish') else 'per-task')
        def step(tasks, steps):
            keep = a.keep and os.path.join(a.keep, '%s-%s.out' % (rev, '-'.join(steps) or 'base'))
            return run(rev, layout, tasks, steps, a.claim, keep, a.spread)
        base = step(0, ())
        s = step(a.tasks, ('schedule',))
        c = step(a.tasks, ('schedule', 'claim'))
        f = step(a.tasks, ('schedule', 'claim', 'finish'))
        print('%-12s instructions per task: schedule %d, claim %d, finish %d' % (
            name, (s - base) / a.tasks, (c - s) / a.tasks, (f - c) / a.tasks))


if __name__ == '__main__':
    main()
