// The host interface as the test host implements it, in Node: every call goes to the TestHost
// that is running a handler (see testing.js).
const current = () => {
  const h = globalThis.__eggtimerTestHost;
  if (!h) throw new Error('no TestHost is running a handler: call host.run(handle, payload)');
  return h;
};

export const log = (level, message) => current().logs.push([level, message]);
export const now = () => current().now;
export const schedule = (t) => current().hostSchedule(t);
export const scheduleWithPriority = (t, priority) => current().hostSchedule(t, priority);
export const cancel = (id) => current().cancelled.push(id);
export const emit = (topic, data) => current().hostEmit(topic, data);
// an absent entry is `null`, as the QuickJS-built component gets it
export const kvGet = (key) => current().kvStore.get(key) ?? null;
export const kvSet = (key, value, ttlMs) => {
  current().kvStore.set(key, value);
  current().kvTtls.set(key, ttlMs === undefined ? undefined : Number(ttlMs));
};
export const kvDelete = (key) => current().kvStore.delete(key);
export const config = (name) => current().config[name];
export const secret = (name) => current().secrets[name];
export const httpSend = (request) => current().hostHttpSend(request);
export const event = () => current().event ?? null;
export const batch = () => current().batch ?? [];
