// A native test host: runs a handler in plain Node and records what it asked for. Run tests with
// `node --import @eggtimer/sdk/register --test` so the host interface resolves to it.
import { createHash } from 'node:crypto';

/** The id the runner gives a follow-up (the same derivation as the host's). */
export function deriveId(parent, occurrence, index) {
  const h = createHash('sha256');
  h.update(`${parent}\n${occurrence}\n${index}`);
  return h.digest('hex').slice(0, 20);
}

/** The Idempotency-Key the runner gives the `index`-th request of an occurrence. */
export function idempotencyKey(task, occurrence, index) {
  const h = createHash('sha256');
  h.update(`http\n${task}\n${occurrence}\n${index}`);
  return h.digest('hex').slice(0, 32);
}

export class TestHost {
  constructor() {
    /** The clock the handler sees (ms). */
    this.now = 1_700_000_000_000;
    /** kv entries as stored (JSON text). */
    this.kvStore = new Map();
    this.kvTtls = new Map();
    /** [topic, parsed data] */
    this.events = [];
    /** [id, {plugin, payload (parsed), runAt, owner, maxAttempts, priority}] */
    this.scheduled = [];
    this.cancelled = [];
    /** [level, message] */
    this.logs = [];
    this.occurrence = 0;
    /** What `config(name)` and `secret(name)` answer. */
    this.config = {};
    this.secrets = {};
    /** The answers requests get, in order: `{status, headers?, body?: string}` or an Error. */
    this.httpResponses = [];
    /** The requests sent: `{method, url, headers, body (text)}`, with the runner's Idempotency-Key. */
    this.httpRequests = [];
  }

  /** Runs `handle` (what `handler(...)` returned) over `payload` (a value or JSON text). */
  run(handle, payload, { id = 'test-task', attempt = 1, maxAttempts = 5, due, owner, event, batch } = {}) {
    /** The event the task got (JSON text), and a debounced task's payloads (JSON texts). */
    this.event = event === undefined ? undefined : JSON.stringify(event);
    this.batch = (batch ?? []).map((p) => JSON.stringify(p));
    const task = {
      id,
      plugin: 'test',
      attempt,
      maxAttempts,
      due: due ?? this.now,
      owner,
      payload: typeof payload === 'string' ? payload : JSON.stringify(payload),
    };
    this.taskId = id;
    this.httpRequests = [];
    globalThis.__eggtimerTestHost = this;
    try {
      return handle(task);
    } finally {
      globalThis.__eggtimerTestHost = undefined;
    }
  }

  /** A kv entry, parsed. */
  kv(key) {
    const v = this.kvStore.get(key);
    return v === undefined ? undefined : JSON.parse(v);
  }

  hostEmit(topic, data) {
    if (!/^[a-z0-9._-]{1,64}$/.test(topic)) throw new Error(`${JSON.stringify(topic)} is not a topic: use 1 to 64 of a-z 0-9 . _ -`);
    this.events.push([topic, JSON.parse(data)]);
  }

  hostHttpSend(req) {
    const headers = req.headers.map(([k, v]) => [k, v]);
    if (!headers.some(([k]) => k.toLowerCase() === 'idempotency-key')) {
      headers.push(['Idempotency-Key', idempotencyKey(this.taskId, this.occurrence, this.httpRequests.length)]);
    }
    this.httpRequests.push({ method: req.method, url: req.url, headers, body: Buffer.from(req.body).toString('utf8') });
    const r = this.httpResponses.shift();
    if (r === undefined) throw new Error(`the test host has no response queued for ${req.method} ${req.url} (push one to httpResponses)`);
    if (r instanceof Error) throw r;
    return { status: r.status, headers: r.headers ?? [], body: [...Buffer.from(r.body ?? '')] };
  }

  hostSchedule(t, priority) {
    if (priority !== undefined && priority > 9) throw new Error('priority must be an integer from 0 to 9');
    const id = deriveId(this.taskId, this.occurrence, this.scheduled.length);
    this.scheduled.push([id, {
      plugin: t.plugin,
      payload: JSON.parse(t.payload),
      runAt: Number(t.runAt),
      owner: t.owner,
      maxAttempts: t.maxAttempts,
      priority,
    }]);
    return id;
  }
}
