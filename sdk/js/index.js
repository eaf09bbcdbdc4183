// The eggtimer plugin SDK for JavaScript and TypeScript: one handler over a parsed payload, and
// what a handler may do while it runs (the WIT worlds `eggtimer:plugin/plugin` and `checked`,
// wit/plugin.wit).
// Build a plugin with `jco componentize --backend qjs` (sdk/README.md); test it natively with
// `node --import @eggtimer/sdk/register --test` and `TestHost` from `@eggtimer/sdk/testing`.
//
// 64-bit integers (times, durations) cross to the host as plain numbers: that is what the QuickJS
// backend converts (a BigInt traps), and every time eggtimer allows (< year 10000 in ms) is
// exact in a double. jco's generated types (wit/) say `bigint`, its other backends' convention.
import * as host from 'eggtimer:plugin/host@0.1.0';

/** What a handler decided. Returning nothing is `Outcome.done()`; throwing is a failed attempt. */
export const Outcome = Object.freeze({
  /** Finished. */
  done: () => ({ tag: 'done' }),
  /** Try again after `ms` (counts as a failed attempt). */
  retryAfter: (ms) => ({ tag: 'retry-after', val: Number(ms) }),
  /** Give up: dead-letter the task with this reason. */
  fail: (reason) => ({ tag: 'fail', val: String(reason) }),
  /** Run this same task again at `at` (ms since the epoch), attempts reset. */
  runAgainAt: (at) => ({ tag: 'run-again-at', val: Number(at) }),
});

/**
 * JSON text the way the Rust SDK writes it (serde_json): object keys sorted, no spaces, so a
 * plugin emits byte for byte what its Rust twin emits.
 */
export function canonicalJson(value) {
  return JSON.stringify(value, (_key, v) => {
    if (typeof v === 'bigint') return Number(v);
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      return Object.fromEntries(Object.keys(v).sort().map((k) => [k, v[k]]));
    }
    return v;
  });
}

/**
 * Declares the plugin's handler: `export const handle = handler((task) => ...)`. The task's
 * payload arrives parsed; times are numbers (ms). A payload that is not JSON fails the task at
 * once (retrying would not help).
 *
 * With `{ payload }` (a validator: `(payload) => string | undefined`, the string naming what
 * does not fit, or a field map made with `fields(...)`), the handler checks its payload first,
 * and `handle.check` is the plugin's `check`: `export const check = handle.check;` lets the
 * runner refuse a task whose payload does not fit when it is scheduled (422), not when it runs.
 * `handle.payloadSchema` says what a field map takes as a JSON Schema: `export const
 * payloadSchema = handle.payloadSchema;` (the `checked` world exports both).
 */
export function handler(fn, { payload: validate } = {}) {
  const checkPayload = validate === undefined ? () => undefined : validator(validate);
  function handle(task) {
    let payload;
    try {
      payload = JSON.parse(task.payload);
    } catch (e) {
      return Outcome.fail(`the payload does not fit this plugin: ${e.message}`);
    }
    const unfit = checkPayload(payload);
    if (unfit !== undefined) {
      return Outcome.fail(`the payload does not fit this plugin: ${unfit}`);
    }
    // the event that made it run (absent: it runs at its due time), a debounced task's payloads
    const event = host.event();
    const out = fn({
      id: task.id,
      plugin: task.plugin,
      attempt: task.attempt,
      maxAttempts: task.maxAttempts,
      due: Number(task.due),
      owner: task.owner ?? undefined,
      payload,
      event: event == null ? undefined : JSON.parse(event),
      batch: host.batch().map((p) => JSON.parse(p)),
    });
    return out === undefined || out === null ? Outcome.done() : out;
  }
  // the WIT's `payload-schema: func() -> option<string>`: a field map's JSON Schema
  const schema = validate?.schema ?? (typeof validate === 'object' ? fields(validate).schema : undefined);
  handle.payloadSchema = () => (schema === undefined ? undefined : JSON.stringify(schema));
  // the WIT's `check: func(payload: string) -> result<_, string>`: a thrown string is the error
  handle.check = (text) => {
    let payload;
    try {
      payload = JSON.parse(text);
    } catch (e) {
      throw `the payload is not JSON: ${e.message}`;
    }
    const unfit = checkPayload(payload);
    if (unfit !== undefined) throw unfit;
  };
  return handle;
}

/** A validator function, or one made from a field map. */
function validator(v) {
  if (typeof v === 'function') {
    return (p) => {
      const r = v(p);
      if (r === false) return 'the payload does not fit';
      return r === undefined || r === null || r === true ? undefined : String(r);
    };
  }
  return fields(v);
}

const JSON_TYPES = {
  string: (x) => typeof x === 'string',
  number: (x) => typeof x === 'number',
  integer: (x) => Number.isInteger(x),
  boolean: (x) => typeof x === 'boolean',
  object: (x) => x !== null && typeof x === 'object' && !Array.isArray(x),
  array: (x) => Array.isArray(x),
  any: () => true,
};

/**
 * A validator from a field map: `fields({ order_id: 'string', amount: 'number?' })`; types are
 * string, number, integer, boolean, object, array, any, a trailing `?` for optional (absent or
 * null). Fields not named are allowed. The message names the first field that does not fit.
 */
export function fields(map) {
  for (const [name, t] of Object.entries(map)) {
    if (!(String(t).replace(/\?$/, '') in JSON_TYPES)) {
      throw new Error(`fields: ${name}: ${t} is not one of ${Object.keys(JSON_TYPES).join(', ')}`);
    }
  }
  const check = (p) => {
    if (!JSON_TYPES.object(p)) return 'expected an object';
    for (const [name, t] of Object.entries(map)) {
      const optional = t.endsWith('?');
      const type = t.replace(/\?$/, '');
      const v = p[name];
      if (v === undefined || v === null) {
        if (optional) continue;
        return `missing field ${name}`;
      }
      if (!JSON_TYPES[type](v)) return `field ${name}: expected ${type}`;
    }
    return undefined;
  };
  // the same as a JSON Schema (what the runner shows of the plugin)
  const properties = {};
  const required = [];
  for (const [name, t] of Object.entries(map)) {
    const type = t.replace(/\?$/, '');
    const one = type === 'any' ? {} : { type };
    properties[name] = t.endsWith('?') ? { anyOf: [one, { type: 'null' }] } : one;
    if (!t.endsWith('?')) required.push(name);
  }
  check.schema = { $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'object', properties, required };
  return check;
}

/** Log lines (kept with the task's run, bounded by the effects budget). */
export const log = Object.freeze({
  debug: (m) => host.log('debug', String(m)),
  info: (m) => host.log('info', String(m)),
  warn: (m) => host.log('warn', String(m)),
  error: (m) => host.log('error', String(m)),
});

/** The host's clock, ms since the Unix epoch. */
export const now = () => Number(host.now());

/**
 * Schedules a follow-up task (`at` defaults to now); returns its id, derived from this run's
 * task so a re-run never schedules it twice. `priority`, 0 (lowest) to 9 (highest), defaults to
 * the priority of the task that schedules it.
 */
export function schedule({ plugin, payload = null, at, owner, maxAttempts, priority }) {
  const t = {
    plugin,
    payload: canonicalJson(payload),
    runAt: Number(at ?? now()),
    owner,
    maxAttempts,
  };
  if (priority === undefined) return host.schedule(t);
  if (!Number.isInteger(priority) || priority < 0 || priority > 9) {
    throw new Error('priority must be an integer from 0 to 9');
  }
  return host.scheduleWithPriority(t, priority);
}

/** Cancels a scheduled task of this plugin. */
export const cancel = (id) => host.cancel(id);

/** Appends an event (any JSON value) to the topic's stream. */
export const emit = (topic, data) => host.emit(topic, canonicalJson(data));

/** The plugin's own key-value store; values are JSON. */
export const kv = Object.freeze({
  get(key) {
    const v = host.kvGet(key);
    // an absent entry: `undefined` by the WIT's types (jco), `null` from the QuickJS backend
    return v === undefined || v === null ? undefined : JSON.parse(v);
  },
  set(key, value, ttlMs) {
    host.kvSet(key, canonicalJson(value), ttlMs === undefined ? undefined : Number(ttlMs));
  },
  delete(key) {
    host.kvDelete(key);
  },
});

/** A value of the plugin's `config` setting, or `undefined`. */
export const config = (name) => host.config(name) ?? undefined;

/** One of the plugin's secrets, or `undefined`. Never log or emit it. */
export const secret = (name) => host.secret(name) ?? undefined;

// UTF-8 by hand: the QuickJS backend has no TextEncoder.
function utf8(s) {
  return Array.from(unescape(encodeURIComponent(s)), (c) => c.charCodeAt(0));
}
function fromUtf8(bytes) {
  let s = '';
  for (const b of bytes) s += String.fromCharCode(b);
  try {
    return decodeURIComponent(escape(s));
  } catch {
    return s;
  }
}

/** An answer: `status`, `headers` ([name, value] pairs), `body` (bytes). */
export class Response {
  constructor({ status, headers, body }) {
    this.status = status;
    this.headers = Array.from(headers ?? [], ([k, v]) => [k, v]);
    this.body = Array.from(body ?? []);
  }
  /** 200 to 299. */
  get ok() {
    return this.status >= 200 && this.status < 300;
  }
  /** The first header of this name (any case). */
  header(name) {
    const n = name.toLowerCase();
    const h = this.headers.find(([k]) => k.toLowerCase() === n);
    return h ? h[1] : undefined;
  }
  text() {
    return fromUtf8(this.body);
  }
  json() {
    return JSON.parse(this.text());
  }
}

/**
 * Outbound HTTP through the host: only to the origins of the plugin's `allowed_hosts`, within
 * the run's budgets and time limit; redirects are returned, not followed. Each request carries
 * an `Idempotency-Key` that is the same on every attempt of this occurrence of the task. A
 * refused or failed request throws (a failed attempt, unless caught).
 */
export const http = Object.freeze({
  /** `{method, url, headers?: {name: value}, body?: string | bytes, json?: any}` → `Response`. */
  send({ method = 'GET', url, headers = {}, body, json }) {
    const hs = Object.entries(headers).map(([k, v]) => [k, String(v)]);
    let bytes = [];
    if (json !== undefined) {
      hs.push(['Content-Type', 'application/json']);
      bytes = utf8(canonicalJson(json));
    } else if (typeof body === 'string') {
      bytes = utf8(body);
    } else if (body) {
      bytes = Array.from(body);
    }
    return new Response(host.httpSend({ method, url, headers: hs, body: bytes }));
  },
  get: (url, opts = {}) => http.send({ ...opts, method: 'GET', url }),
  post: (url, opts = {}) => http.send({ ...opts, method: 'POST', url }),
  put: (url, opts = {}) => http.send({ ...opts, method: 'PUT', url }),
  delete: (url, opts = {}) => http.send({ ...opts, method: 'DELETE', url }),
});
