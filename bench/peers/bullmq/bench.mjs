// BullMQ running eggtimer's W0, W1 and W2 (the benchmark's BENCHMARKS.md) on this machine, so a
// ratio between the two is one command: `cargo xtask bench --peer bullmq`.
//
//   node bench.mjs [--only W0,W1,W2] [--n 100000] [--remove-on-complete true]
//
// It starts its own redis-server (a free port, no persistence: no RDB, no AOF) and prints one
// JSON line per workload, with the field names of eggtimer-bench's reports and "peer": "bullmq".
// The worker is BullMQ's own: a no-op processor at concurrency 50 that notes when each job
// started. Completed jobs are kept, BullMQ's default (eggtimer keeps a done task's record too,
// for `--keep-done`); `--remove-on-complete true` removes each as it completes, BullMQ's
// cheapest setting.
//
// - W0: n delayed jobs (a day ahead, ids b0, b1, …) added in batches of 1,000 (`addBulk`), four
//   batches at once — jobs/s.
// - W1: n jobs due evenly over 10 s, all added before the first is due — lateness (processor
//   start − due time, ms) p50/p95/p99/max, missing, duplicates, early.
// - W2: n jobs due at one instant, all added before it — drain time (last start − the instant),
//   jobs/s, lateness, Redis CPU per job while draining.

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

const args = parseArgs(process.argv.slice(2));
const N = Number(args.n ?? 100_000);
const ONLY = (args.only ?? 'W0,W1,W2').split(',').map((w) => w.trim().toUpperCase());
const REMOVE_ON_COMPLETE = args['remove-on-complete'] === 'true';
const CONCURRENCY = 50;
const QUEUE = 'bench';

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i];
    if (!flag.startsWith('--') || argv[i + 1] === undefined) {
      throw new Error(`usage: node bench.mjs [--only W0,W1,W2] [--n N] [--remove-on-complete true]; got ${argv.join(' ')}`);
    }
    out[flag.slice(2)] = argv[i + 1];
  }
  return out;
}

/** Milliseconds since the epoch, with µs precision. */
const now = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const round = (x) => Math.round(x * 100) / 100;

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** A private redis-server without persistence; resolves once it answers PING. */
async function startRedis() {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'eggtimer-bullmq-'));
  const child = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
    { stdio: ['ignore', 'ignore', 'inherit'] },
  );
  child.on('error', (e) => {
    console.error(`redis-server could not start (${e.message}); install it: apt install redis-server`);
    process.exit(1);
  });
  const redis = new IORedis({ port, host: '127.0.0.1', maxRetriesPerRequest: null, lazyConnect: true });
  redis.on('error', () => {}); // refused until the server listens: the loop below retries
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      await redis.connect();
      await redis.ping();
      break;
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`redis-server on ${port} did not answer: ${e.message}`);
      redis.disconnect();
      await sleep(50);
    }
  }
  const stop = () => {
    redis.disconnect();
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };
  return { port, redis, stop };
}

/** Redis's CPU seconds so far (user + sys, every thread). */
async function redisCpu(redis) {
  const info = await redis.info('cpu');
  const field = (k) => Number(info.match(new RegExp(`^${k}:([0-9.]+)`, 'm'))[1]);
  return field('used_cpu_user') + field('used_cpu_sys');
}

function percentiles(xs) {
  const s = Float64Array.from(xs).sort();
  const at = (q) => (s.length ? s[Math.min(s.length - 1, Math.floor(q * s.length))] : 0);
  return { p50: round(at(0.5)), p95: round(at(0.95)), p99: round(at(0.99)), max: round(s.length ? s[s.length - 1] : 0) };
}

/** Adds `jobs` (`{ name, data, opts }`) in batches of 1,000, four batches at once. */
async function addAll(queue, jobs) {
  const batches = [];
  for (let i = 0; i < jobs.length; i += 1000) batches.push(jobs.slice(i, i + 1000));
  let next = 0;
  const lane = async () => {
    while (next < batches.length) await queue.addBulk(batches[next++]);
  };
  await Promise.all([lane(), lane(), lane(), lane()]);
}

/**
 * Runs jobs due at `dues[i]` (ms since the epoch) with a BullMQ worker and counts them; the
 * jobs are added first and the worker started after, all before the first due time.
 */
async function runDue(env, dues) {
  const { connection, redis } = env;
  const n = dues.length;
  const queue = new Queue(QUEUE, { connection, defaultJobOptions: { removeOnComplete: REMOVE_ON_COMPLETE } });
  const jobs = dues.map((due, i) => ({
    name: 'noop',
    data: { i, due },
    opts: { jobId: `b${i}`, delay: Math.max(0, Math.round(due - now())) },
  }));
  await addAll(queue, jobs);
  const first = Math.min(...dues);
  if (now() > first) throw new Error('adding the jobs took past the first due time; run with a smaller --n');
  const runs = new Uint32Array(n);
  const late = new Float64Array(n);
  let executed = 0;
  let firstStart = Infinity;
  let lastStart = 0;
  let done;
  const all = new Promise((r) => (done = r));
  const worker = new Worker(
    QUEUE,
    async (job) => {
      const t = now();
      const { i, due } = job.data;
      if (runs[i]++ === 0) {
        late[i] = t - due;
        if (++executed === n) done();
      }
      firstStart = Math.min(firstStart, t);
      lastStart = Math.max(lastStart, t);
    },
    { connection, concurrency: CONCURRENCY },
  );
  await worker.waitUntilReady();
  const cpu0 = await redisCpu(redis);
  const wall0 = now();
  const last = Math.max(...dues);
  let timer;
  const deadline = new Promise((r) => (timer = setTimeout(r, last - now() + 120_000)));
  await Promise.race([all, deadline]);
  clearTimeout(timer);
  const wall = now() - Math.max(wall0, first);
  const cpu = (await redisCpu(redis)) - cpu0;
  await worker.close();
  await queue.close();
  let missing = 0;
  let duplicates = 0;
  let early = 0;
  const lateness = [];
  for (let i = 0; i < n; i++) {
    if (runs[i] === 0) missing++;
    else {
      if (runs[i] > 1) duplicates++;
      if (late[i] < 0) early++;
      lateness.push(late[i]);
    }
  }
  return {
    lateness_ms: percentiles(lateness),
    outcomes: { executed, missing, duplicates, early },
    firstStart,
    lastStart,
    redisCpuS: cpu,
    wallMs: wall,
  };
}

async function w0(env) {
  const queue = new Queue(QUEUE, { connection: env.connection });
  const far = now() + 86_400_000;
  const jobs = Array.from({ length: N }, (_, i) => ({
    name: 'noop',
    data: { i, due: far },
    opts: { jobId: `b${i}`, delay: 86_400_000 },
  }));
  const cpu0 = await redisCpu(env.redis);
  const t0 = now();
  await addAll(queue, jobs);
  const secs = (now() - t0) / 1000;
  const cpu = (await redisCpu(env.redis)) - cpu0;
  const stored = await queue.getDelayedCount();
  await queue.close();
  return {
    workload: 'W0',
    peer: 'bullmq',
    n: N,
    batch: 1000,
    concurrency: 4,
    seconds: round(secs),
    tasks_per_s: Math.round(N / secs),
    stored,
    redis_cpu_us_per_task: round((cpu * 1e6) / N),
  };
}

async function w1(env) {
  const start = now() + 3000 + N / 6; // adding runs at ~10k jobs/s here
  const dues = Array.from({ length: N }, (_, i) => start + (i * 10_000) / N);
  const r = await runDue(env, dues);
  const span = (r.lastStart - r.firstStart) / 1000;
  return {
    workload: 'W1',
    peer: 'bullmq',
    remove_on_complete: REMOVE_ON_COMPLETE,
    n: N,
    spread_s: 10,
    lateness_ms: r.lateness_ms,
    processed_per_s: Math.round(r.outcomes.executed / Math.max(span, 1e-9)),
    ...r.outcomes,
    redis_cpu_share: round(r.redisCpuS / (r.wallMs / 1000)),
  };
}

async function w2(env) {
  const at = now() + 3000 + N / 6;
  const r = await runDue(env, new Array(N).fill(at));
  const drain = (r.lastStart - at) / 1000;
  return {
    workload: 'W2',
    peer: 'bullmq',
    remove_on_complete: REMOVE_ON_COMPLETE,
    n: N,
    drain_s: round(drain),
    tasks_per_s: Math.round(r.outcomes.executed / Math.max(drain, 1e-9)),
    lateness_ms: r.lateness_ms,
    ...r.outcomes,
    redis_cpu_us_per_task_claim_and_finish: round((r.redisCpuS * 1e6) / N),
  };
}

const workloads = { W0: w0, W1: w1, W2: w2 };
for (const w of ONLY) {
  if (!workloads[w]) throw new Error(`the BullMQ peer runs W0, W1 and W2, not ${w}`);
}
const server = await startRedis();
const env = { connection: { host: '127.0.0.1', port: server.port }, redis: server.redis };
try {
  for (const w of ONLY) {
    await server.redis.flushall();
    console.log(JSON.stringify(await workloads[w](env)));
  }
} finally {
  server.stop();
}
