// @eggtimer/client against a real runner: EGGTIMER_URL (and EGGTIMER_TOKEN) name it; the plugin
// EGGTIMER_PLUGIN (default `noop`) must be loaded there. tests/tests/clients.rs starts both.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Client, EggtimerError } from '../index.js';

const PLUGIN = process.env.EGGTIMER_PLUGIN ?? 'noop';
const HOUR = 3_600_000;
let et;

before(() => {
  if (!process.env.EGGTIMER_URL) {
    throw new Error('set EGGTIMER_URL to a running eggtimer (cargo xtask run serves http://127.0.0.1:8080)');
  }
  et = new Client({ url: process.env.EGGTIMER_URL, token: process.env.EGGTIMER_TOKEN });
});

const fresh = (what) => `js-${what}-${randomUUID().slice(0, 8)}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitForState(id, state) {
  const deadline = Date.now() + 30_000;
  let task;
  while (Date.now() < deadline) {
    task = await et.get(id);
    if (task?.state === state) return task;
    await sleep(50);
  }
  assert.fail(`task ${id} never became ${state}: ${JSON.stringify(task)}`);
}

test('schedule, move, cancel', async () => {
  const id = fresh('order');
  const at = Date.now() + HOUR;
  assert.deepEqual(await et.schedule(PLUGIN, { order_id: 'o-17', n: 1 }, { id, run_at: at, owner: 'u-js', priority: 4 }), {
    id,
    run_at: at,
  });
  const task = await et.get(id);
  assert.equal(task.state, 'scheduled');
  assert.deepEqual(task.payload, { order_id: 'o-17', n: 1 });
  assert.equal(task.owner, 'u-js');
  assert.equal(task.priority, 4);

  assert.equal((await et.move(id, { shiftMs: -HOUR / 2 })).run_at, at - HOUR / 2);
  assert.equal((await et.get(id)).run_at, at - HOUR / 2);
  assert.equal((await et.move(id, { runAt: at + 5 })).run_at, at + 5);
  assert.throws(() => et.move(id, {}), TypeError);

  assert.equal(await et.cancel(id), true);
  assert.equal(await et.get(id), null);
  assert.equal(await et.cancel(id), false);
});

test('one id in two plugins: inPlugin names one', async () => {
  const other = process.env.EGGTIMER_PLUGIN_2 ?? 'bench-record';
  const id = fresh('twin');
  const at = Date.now() + HOUR;
  for (const plugin of [PLUGIN, other]) await et.schedule(plugin, {}, { id, run_at: at });
  await assert.rejects(et.get(id), (e) => e instanceof EggtimerError && e.code === 'ambiguous_id');
  const mine = et.inPlugin(other);
  assert.equal((await mine.get(id)).plugin, other);
  assert.equal((await mine.move(id, { shiftMs: 5 })).run_at, at + 5);
  assert.equal(await mine.cancel(id), true);
  assert.equal((await et.get(id)).plugin, PLUGIN);
  assert.equal(await et.cancel(id), true);
});

test('a task due now runs', async () => {
  const { id } = await et.schedule(PLUGIN, { n: 2 });
  assert.ok(id);
  await waitForState(id, 'done');
});

test('run now', async () => {
  const id = fresh('later');
  await et.schedule(PLUGIN, {}, { id, delay_ms: HOUR });
  await et.runNow(id);
  await waitForState(id, 'done');
});

test('an error reply throws with status, code and message', async () => {
  await assert.rejects(et.schedule('no-such-plugin-js', {}), (e) => {
    assert.ok(e instanceof EggtimerError);
    assert.equal(e.status, 422);
    assert.match(e.message, /no-such-plugin-js/);
    return true;
  });
  await assert.rejects(et.schedule(PLUGIN, {}, { run_at: Number.MAX_SAFE_INTEGER }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.code, 'bad_request');
    return true;
  });
});

test('unreachable says so', async () => {
  await assert.rejects(new Client({ url: 'http://127.0.0.1:9', timeoutMs: 2000 }).get('x'), (e) => {
    assert.equal(e.status, 0);
    assert.match(e.message, /is eggtimer running there\?/);
    return true;
  });
});

test("an owner's tasks", async () => {
  const owner = fresh('owner');
  const at = Date.now() + HOUR;
  const ids = [0, 1, 2].map((i) => `${owner}-${i}`);
  const made = await et.scheduleMany(ids.map((id, i) => ({ plugin: PLUGIN, id, owner, run_at: at + i })));
  assert.deepEqual(made.map((m) => m.id), ids);
  const list = async () => {
    const out = [];
    for await (const t of et.ownerTasks(owner)) out.push(t);
    return out;
  };
  assert.deepEqual((await list()).map((t) => t.id), ids);
  assert.equal(await et.shiftOwner(owner, -1000, PLUGIN), 3);
  assert.deepEqual((await list()).map((t) => t.run_at), [0, 1, 2].map((i) => at - 1000 + i));
  assert.deepEqual(await et.pauseOwner(owner, PLUGIN), { all: false, plugins: [PLUGIN] });
  const stats = await et.ownerStats(owner);
  assert.deepEqual(stats.plugins, [{ plugin: PLUGIN, scheduled: 3, running: 0, dead: 0, pending: 3 }]);
  assert.deepEqual(stats.paused, { all: false, plugins: [PLUGIN] });
  assert.equal(await et.resumeOwner(owner), 0); // none was due: none was parked
  assert.deepEqual((await et.ownerStats(owner)).paused, { all: false, plugins: [] });
  assert.equal(await et.cancelOwner(owner), 3);
  assert.deepEqual(await list(), []);
});

test('an event cancels the task listening for it', async () => {
  const id = fresh('paid');
  await et.schedule(PLUGIN, {}, { id, run_at: Date.now() + HOUR, on: [{ topic: 'payments', key: id, then: 'cancel' }] });
  assert.equal(await et.publish('payments', id, { amount: 5 }), 1);
  assert.equal(await et.get(id), null);
  assert.equal(await et.publish('payments', id), 0);
});

test('a debounced task gathers the payloads of its key', async () => {
  const key = fresh('feed');
  const debounce = { key, quiet_ms: HOUR, max_wait_ms: 2 * HOUR };
  assert.deepEqual(await et.schedule(PLUGIN, { n: 1 }, { debounce }), { id: key, debounced: 'new' });
  assert.deepEqual(await et.scheduleMany([{ plugin: PLUGIN, payload: { n: 2 }, debounce }]), [
    { id: key, debounced: 'merged' },
  ]);
  assert.deepEqual((await et.get(key)).batch, [{ n: 1 }, { n: 2 }]);
  assert.equal(await et.cancel(key), true);
});

test('a recurring schedule', async () => {
  const id = fresh('sweep');
  const got = await et.putSchedule(id, PLUGIN, { sweep: true }, { cron: '30 9 * * *', tz: 'Europe/Berlin' });
  assert.equal(got.id, id);
  assert.ok(got.next_run_at > Date.now());
  assert.equal((await et.getSchedule(id)).cron, '30 9 * * *');
  await et.deleteSchedule(id);
  assert.equal(await et.getSchedule(id), null);
});
