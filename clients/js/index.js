// A client for eggtimer's HTTP API: schedule, move, cancel and read tasks from your own services.
// No dependencies: the platform's fetch (Node.js 18+, Deno, Bun, browsers). Types: index.d.ts.

/** An error reply of the API (`status`, `code`, `message`), or status 0 when it was unreachable. */
export class EggtimerError extends Error {
  constructor(status, code, message) {
    super(`${status} ${code}: ${message}`);
    this.name = 'EggtimerError';
    this.status = status;
    this.code = code;
    this.message = message;
  }
}

const seg = (s) => encodeURIComponent(s);

/** Drops the keys whose value is undefined or null (the API's optional fields). */
function defined(obj) {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined && v !== null));
}

export class Client {
  /** @param {{url?: string, token?: string, timeoutMs?: number}} [options] */
  constructor({ url = 'http://127.0.0.1:8080', token, timeoutMs = 10_000, plugin } = {}) {
    this.url = url.replace(/\/+$/, '');
    this.token = token;
    this.timeoutMs = timeoutMs;
    this.plugin = plugin;
  }

  /** A client whose calls by task id name the task of this plugin (`?plugin=`): needed only
   *  where plugins your key may see each have a task of one id (else 409 `ambiguous_id`). */
  inPlugin(plugin) {
    return new Client({ url: this.url, token: this.token, timeoutMs: this.timeoutMs, plugin });
  }

  #task(id, then = '') {
    const q = this.plugin === undefined ? '' : `?plugin=${seg(this.plugin)}`;
    return `/v1/tasks/${seg(id)}${then}${q}`;
  }

  // --- tasks ---

  schedule(plugin, payload, options = {}) {
    return this.#call('POST', '/v1/tasks', defined({ plugin, payload, ...options }));
  }

  scheduleMany(specs) {
    return this.#call('POST', '/v1/tasks', specs.map(defined));
  }

  async get(id) {
    return this.#orNull(this.#call('GET', this.#task(id)));
  }

  move(id, to) {
    const { runAt, shiftMs } = to ?? {};
    if ((runAt === undefined) === (shiftMs === undefined)) {
      throw new TypeError('move takes one of runAt or shiftMs');
    }
    const body = runAt !== undefined ? { run_at: runAt } : { shift_ms: shiftMs };
    return this.#call('PATCH', this.#task(id), body);
  }

  async cancel(id) {
    try {
      await this.#call('DELETE', this.#task(id));
      return true;
    } catch (e) {
      if (e instanceof EggtimerError && e.status === 404) return false;
      throw e;
    }
  }

  async runNow(id) {
    await this.#call('POST', this.#task(id, '/run'));
  }

  // --- an owner's tasks ---

  async *ownerTasks(owner) {
    let cursor;
    do {
      const query = new URLSearchParams({ limit: '1000' });
      if (cursor) query.set('cursor', cursor);
      const { body, headers } = await this.#request('GET', `/v1/owners/${seg(owner)}/tasks?${query}`);
      yield* body;
      cursor = headers.get('x-next-cursor');
    } while (cursor);
  }

  async shiftOwner(owner, shiftMs, plugin) {
    return (await this.#call('POST', `/v1/owners/${seg(owner)}/shift`, defined({ shift_ms: shiftMs, plugin })))
      .shifted;
  }

  async cancelOwner(owner, plugin) {
    const query = plugin === undefined ? '' : `?${new URLSearchParams({ plugin })}`;
    return (await this.#call('DELETE', `/v1/owners/${seg(owner)}/tasks${query}`)).cancelled;
  }

  /** Pauses the owner's tasks (of one plugin, if given); the owner's pauses. */
  async pauseOwner(owner, plugin) {
    return (await this.#call('POST', `/v1/owners/${seg(owner)}/pause`, defined({ plugin }))).paused;
  }

  /** Resumes the owner's tasks (of one plugin; without one, every pause); how many were put back. */
  async resumeOwner(owner, plugin) {
    return (await this.#call('POST', `/v1/owners/${seg(owner)}/resume`, defined({ plugin }))).resumed;
  }

  /** The owner's scheduled, running and dead tasks per plugin, and its pauses. */
  async ownerStats(owner) {
    return this.#call('GET', `/v1/owners/${seg(owner)}/stats`);
  }

  // --- events ---

  /** Publishes an event: the tasks listening on `topic` with `key` are cancelled or run now; how many it reached. */
  async publish(topic, key, data = null) {
    return (await this.#call('POST', `/v1/events/${seg(topic)}`, { key, data })).matched;
  }

  // --- recurring schedules ---

  putSchedule(id, plugin, payload, options = {}) {
    return this.#call('PUT', `/v1/schedules/${seg(id)}`, defined({ plugin, payload, ...options }));
  }

  getSchedule(id) {
    return this.#orNull(this.#call('GET', `/v1/schedules/${seg(id)}`));
  }

  async deleteSchedule(id) {
    await this.#call('DELETE', `/v1/schedules/${seg(id)}`);
  }

  // --- the wire ---

  async #orNull(promise) {
    try {
      return await promise;
    } catch (e) {
      if (e instanceof EggtimerError && e.status === 404) return null;
      throw e;
    }
  }

  async #call(method, path, body) {
    return (await this.#request(method, path, body)).body;
  }

  async #request(method, path, body) {
    const headers = { accept: 'application/json' };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    let resp;
    try {
      resp = await fetch(this.url + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e) {
      throw new EggtimerError(0, 'unreachable', `${method} ${this.url}${path}: is eggtimer running there? (${e.cause?.code ?? e.message})`);
    }
    const text = await resp.text();
    let parsed = null;
    if (text) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = text;
      }
    }
    if (!resp.ok) {
      const err = parsed?.error;
      throw new EggtimerError(resp.status, err?.code ?? 'http_error', err?.message ?? String(text));
    }
    return { body: parsed, headers: resp.headers };
  }
}
