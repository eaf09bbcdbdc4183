// The SDK over its native test host (run: node --import ./register.js --test test/).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Outcome, canonicalJson, emit, fields, handler, kv, schedule, now, log } from '../index.js';
import { TestHost, deriveId } from '../testing.js';

test('a handler gets the parsed payload and its effects are recorded', () => {
  const host = new TestHost();
  const handle = handler((task) => {
    emit('push', { user: task.payload.user, b: 2, a: 1 });
    kv.set('seen', { n: 1 }, 60_000);
    log.info('hello');
    schedule({ plugin: 'next', payload: { after: task.id }, at: now() + 5 });
  });
  assert.deepEqual(host.run(handle, { user: 'u1' }), { tag: 'done' });
  assert.deepEqual(host.events, [['push', { a: 1, b: 2, user: 'u1' }]]);
  assert.deepEqual(host.kv('seen'), { n: 1 });
  assert.deepEqual(host.logs, [['info', 'hello']]);
  assert.equal(host.scheduled.length, 1);
  const [id, t] = host.scheduled[0];
  assert.equal(id, deriveId('test-task', 0, 0));
  assert.deepEqual(t, { plugin: 'next', payload: { after: 'test-task' }, runAt: host.now + 5, owner: undefined, maxAttempts: undefined, priority: undefined });
});

test("a follow-up's priority is passed on; outside 0 to 9 it is refused", () => {
  const host = new TestHost();
  const handle = handler(() => {
    schedule({ plugin: 'next', priority: 9 });
    schedule({ plugin: 'next' });
    for (const p of [10, -1, 1.5, '9']) {
      assert.throws(() => schedule({ plugin: 'next', priority: p }), /priority must be an integer from 0 to 9/);
    }
  });
  assert.deepEqual(host.run(handle, {}), { tag: 'done' });
  assert.deepEqual(host.scheduled.map(([, t]) => t.priority), [9, undefined]);
});

test('outcomes are the WIT variants, times as numbers (the QuickJS convention)', () => {
  const host = new TestHost();
  assert.deepEqual(host.run(handler(() => Outcome.retryAfter(5000)), {}), { tag: 'retry-after', val: 5000 });
  assert.deepEqual(host.run(handler(() => Outcome.fail('no')), {}), { tag: 'fail', val: 'no' });
  assert.deepEqual(host.run(handler(() => Outcome.runAgainAt(7)), {}), { tag: 'run-again-at', val: 7 });
});

test('a payload that is not JSON fails the task; a thrown error propagates (a failed attempt)', () => {
  const host = new TestHost();
  const out = host.run(handler(() => undefined), 'not json');
  assert.equal(out.tag, 'fail');
  assert.match(out.val, /does not fit this plugin/);
  assert.throws(() => host.run(handler(() => { throw new Error('boom'); }), {}), /boom/);
  assert.throws(() => host.run(handler(() => emit('Bad Topic', {})), {}), /not a topic/);
});

test('JSON is written as the Rust SDK writes it: keys sorted, no spaces', () => {
  assert.equal(canonicalJson({ type: 't', coupon_id: 'c', nested: { z: 1, a: [2, { y: 1, x: 2 }] } }),
    '{"coupon_id":"c","nested":{"a":[2,{"x":2,"y":1}],"z":1},"type":"t"}');
  // the ids match the runner's (runner/src/plugins/host.rs derive_id; sdk/src/testing.rs)
  assert.equal(deriveId('a', 1, 0), '84dd294af2ae10c149d7');
});

test('http, config and secret answer what the test queued; requests carry the runner\'s key', async () => {
  const { http, config, secret } = await import('../index.js');
  const { idempotencyKey } = await import('../testing.js');
  const host = new TestHost();
  host.config.region = 'eu';
  host.secrets.token = 's3cret';
  host.httpResponses.push({ status: 202, body: '{"ok":true}' }, new Error('refused'));
  const handle = handler(() => {
    const r = http.post('https://api.example.com/x', { json: { b: 1, a: 'é' }, headers: { 'X-Region': config('region') } });
    assert.throws(() => http.get('https://api.example.com/y'), /refused/);
    assert.equal(secret('token'), 's3cret');
    assert.equal(secret('nope'), undefined);
    return r.ok && r.json().ok ? Outcome.done() : Outcome.fail(r.text());
  });
  assert.deepEqual(host.run(handle, {}), { tag: 'done' });
  assert.equal(host.httpRequests.length, 2);
  assert.equal(host.httpRequests[0].body, '{"a":"é","b":1}');
  const key = (i) => host.httpRequests[i].headers.find(([k]) => k === 'Idempotency-Key')[1];
  assert.equal(key(0), idempotencyKey('test-task', 0, 0));
  assert.notEqual(key(0), key(1));
  // the runner's vector (plugins::http tests)
  assert.equal(idempotencyKey('order-1', 1700000000000, 0), '639a89dd1912f80fb0a54ffc7bf232cb');
});

test('a declared payload is the plugin\'s check, and the handler\'s', () => {
  const host = new TestHost();
  const handle = handler(() => {}, { payload: fields({ order_id: 'string', n: 'integer?' }) });
  assert.equal(handle.check('{"order_id": "o1"}'), undefined);
  assert.equal(handle.check('{"order_id": "o1", "n": null}'), undefined);
  assert.throws(() => handle.check('{"n": 1}'), (e) => e === 'missing field order_id');
  assert.throws(() => handle.check('{"order_id": "o", "n": 1.5}'), (e) => e === 'field n: expected integer');
  assert.throws(() => handle.check('[1]'), (e) => e === 'expected an object');
  assert.throws(() => handle.check('not json'), (e) => e.startsWith('the payload is not JSON'));
  const out = host.run(handle, { n: 2 });
  assert.equal(out.tag, 'fail');
  assert.match(out.val, /does not fit this plugin: missing field order_id/);
  // a validator function: a string names what does not fit
  const own = handler(() => {}, { payload: (p) => (p.ok ? undefined : 'not ok') });
  assert.equal(own.check('{"ok": true}'), undefined);
  assert.throws(() => own.check('{}'), (e) => e === 'not ok');
  // without one, any JSON fits
  assert.equal(handler(() => {}).check('{"anything": [1]}'), undefined);
  assert.throws(() => fields({ a: 'strin' }), /not one of/);
});

test('a field map is described as JSON Schema', () => {
  const handle = handler(() => {}, { payload: fields({ order_id: 'string', n: 'integer?' }) });
  const schema = JSON.parse(handle.payloadSchema());
  assert.deepEqual(schema.required, ['order_id']);
  assert.deepEqual(schema.properties.order_id, { type: 'string' });
  assert.deepEqual(schema.properties.n, { anyOf: [{ type: 'integer' }, { type: 'null' }] });
  assert.equal(handler(() => {}, { payload: () => undefined }).payloadSchema(), undefined);
  assert.equal(handler(() => {}).payloadSchema(), undefined);
});

test('a handler gets the event that made it run and a debounced task\'s batch', () => {
  const host = new TestHost();
  let seen;
  const handle = handler((task) => {
    seen = task;
  });
  host.run(handle, { n: 2 }, { event: { id: '3-1', topic: 'payments', key: 'o1', at: 5, data: { amount: 7 } }, batch: [{ n: 1 }, { n: 2 }] });
  assert.deepEqual(seen.event, { id: '3-1', topic: 'payments', key: 'o1', at: 5, data: { amount: 7 } });
  assert.deepEqual(seen.batch, [{ n: 1 }, { n: 2 }]);
  host.run(handle, { n: 1 });
  assert.equal(seen.event, undefined);
  assert.deepEqual(seen.batch, []);
});
