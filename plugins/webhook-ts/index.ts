// `webhook-ts`: the webhook sample in TypeScript, delivering exactly what the Rust `webhook` does.
// Payload: `{"url", "body": any JSON, "headers"?: {name: value}}`. It POSTs `body` as JSON (keys
// sorted, no spaces: the bytes the Rust sample sends) to `url` with `X-Eggtimer-Signature:
// sha256=<hex HMAC-SHA256 of the body, keyed with the secret "signing_key">`, `X-Eggtimer-Task`
// and the host's Idempotency-Key. 2xx: done. 408, 429 (after its `Retry-After`) and 5xx: a failed
// attempt, retried with backoff. Other statuses: failed for good, with the status and the first
// KiB of the answer. QuickJS has no crypto, so SHA-256 and HMAC are written out below (FIPS 180-4,
// RFC 2104).
import { Outcome, canonicalJson, handler, http, secret } from '@eggtimer/sdk';

interface Delivery {
  url: string;
  body: unknown;
  headers?: Record<string, string>;
}

/** How much of a refusing answer goes into the error. */
const SHOWN = 1024;

export const handle = handler<Delivery>((task) => {
  const d = task.payload;
  if (typeof d?.url !== 'string') {
    return Outcome.fail(`the payload does not fit this plugin (it needs "url" and "body"): ${canonicalJson(d)}`);
  }
  const key = secret('signing_key');
  if (key === undefined) {
    return Outcome.fail(
      'the webhook plugin has no secret "signing_key": set it with `eggtimer plugin secret set webhook-ts signing_key`',
    );
  }
  const body = utf8(canonicalJson(d.body));
  const headers: Record<string, string> = {
    'Content-Type': 'application/json',
    'X-Eggtimer-Signature': signature(key, body),
    'X-Eggtimer-Task': task.id,
    ...(d.headers ?? {}),
  };
  // a refused or failed request (not allowed, unreachable, too slow) throws: a failed attempt
  const r = http.post(d.url, { body, headers });
  const shown = () => `the receiver answered ${r.status}: ${r.text().slice(0, SHOWN)}`;
  if (r.status >= 200 && r.status < 300) {
    return Outcome.done();
  }
  if (r.status === 429) {
    const secs = Number.parseInt(r.header('retry-after')?.trim() ?? '', 10);
    if (Number.isFinite(secs) && secs >= 0) {
      return Outcome.retryAfter(Math.min(secs, 3600) * 1000);
    }
    throw new Error(shown());
  }
  if (r.status === 408 || r.status >= 500) {
    throw new Error(shown());
  }
  return Outcome.fail(shown());
});

/** `sha256=<hex>` of `body`, keyed with `key`. */
export function signature(key: string, body: Uint8Array): string {
  return `sha256=${hex(hmacSha256(utf8(key), body))}`;
}

function utf8(s: string): Uint8Array {
  const out: number[] = [];
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return Uint8Array.from(out);
}

function hex(bytes: Uint8Array): string {
  let s = '';
  for (const b of bytes) s += b.toString(16).padStart(2, '0');
  return s;
}

function hmacSha256(key: Uint8Array, message: Uint8Array): Uint8Array {
  const block = 64;
  const k = new Uint8Array(block);
  k.set(key.length > block ? sha256(key) : key);
  const inner = new Uint8Array(block + message.length);
  const outer = new Uint8Array(block + 32);
  for (let i = 0; i < block; i++) {
    inner[i] = k[i] ^ 0x36;
    outer[i] = k[i] ^ 0x5c;
  }
  inner.set(message, block);
  outer.set(sha256(inner), block);
  return sha256(outer);
}

const K = Uint32Array.from([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

function sha256(data: Uint8Array): Uint8Array {
  // padding: 0x80, zeros, the length in bits as 64-bit big-endian
  const padded = new Uint8Array((((data.length + 9 + 63) >> 6) << 6));
  padded.set(data);
  padded[data.length] = 0x80;
  const bits = data.length * 8;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 8, Math.floor(bits / 0x100000000));
  view.setUint32(padded.length - 4, bits >>> 0);
  const h = Uint32Array.from([
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
  ]);
  const w = new Uint32Array(64);
  const rotr = (x: number, n: number) => (x >>> n) | (x << (32 - n));
  for (let off = 0; off < padded.length; off += 64) {
    for (let i = 0; i < 16; i++) w[i] = view.getUint32(off + i * 4);
    for (let i = 16; i < 64; i++) {
      const s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >>> 3);
      const s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) >>> 0;
    }
    let [a, b, c, d, e, f, g, hh] = h;
    for (let i = 0; i < 64; i++) {
      const t1 = (hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i]) >>> 0;
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) >>> 0;
      hh = g;
      g = f;
      f = e;
      e = (d + t1) >>> 0;
      d = c;
      c = b;
      b = a;
      a = (t1 + t2) >>> 0;
    }
    h[0] = (h[0] + a) >>> 0;
    h[1] = (h[1] + b) >>> 0;
    h[2] = (h[2] + c) >>> 0;
    h[3] = (h[3] + d) >>> 0;
    h[4] = (h[4] + e) >>> 0;
    h[5] = (h[5] + f) >>> 0;
    h[6] = (h[6] + g) >>> 0;
    h[7] = (h[7] + hh) >>> 0;
  }
  const out = new Uint8Array(32);
  const ov = new DataView(out.buffer);
  for (let i = 0; i < 8; i++) ov.setUint32(i * 4, h[i]);
  return out;
}
