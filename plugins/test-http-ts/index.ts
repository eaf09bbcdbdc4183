// Test plugin: POSTs `payload.body` as JSON to `config("url")` with the header `X-Token:
// secret("token")`, and emits on `http` what came back: status, the `X-Echo` header, the body.
import { config, emit, handler, http, secret } from '@eggtimer/sdk';

export const handle = handler<{ body: unknown }>((task) => {
  const r = http.post(config('url') ?? 'http://missing', {
    json: task.payload.body,
    headers: { 'X-Token': secret('token') ?? 'none' },
  });
  emit('http', { status: r.status, echo: r.header('x-echo') ?? null, body: r.text() });
});
