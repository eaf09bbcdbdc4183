// `order-cancel-ts`: the order-cancel sample in TypeScript. Cancels an order left unpaid and
// emits `order_cancelled` on the `order` topic exactly once per order, even if the task runs
// twice: the cancellation is recorded in the plugin's kv store (applied with the event).
import { Outcome, emit, handler, kv } from '@eggtimer/sdk';

interface Order {
  order_id: string;
  user_id: string;
}

/** How long the "already cancelled" record is kept (30 days). */
const REMEMBER_MS = 30 * 24 * 3600 * 1000;

export const handle = handler<Order>((task) => {
  const o = task.payload;
  if (typeof o?.order_id !== 'string' || typeof o.user_id !== 'string') {
    return Outcome.fail(`the payload does not fit this plugin: ${JSON.stringify(o)}`);
  }
  const key = `cancelled:${o.order_id}`;
  if (kv.get<boolean>(key) !== undefined) {
    return; // cancelled by an earlier run
  }
  kv.set(key, true, REMEMBER_MS);
  emit('order', { type: 'order_cancelled', order_id: o.order_id, user_id: o.user_id });
});
