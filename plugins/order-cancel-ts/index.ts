// `order-cancel-ts`: the order-cancel sample in TypeScript. Cancels an order left unpaid and
// emits `order_cancelled` on the `order` topic exactly once per order, even if the task runs
// twice: the cancellation is recorded in the plugin's kv store (applied with the event).
import { emit, fields, handler, kv } from '@eggtimer/sdk';

interface Order {
  order_id: string;
  user_id: string;
}

/** How long the "already cancelled" record is kept (30 days). */
const REMEMBER_MS = 30 * 24 * 3600 * 1000;

export const handle = handler<Order>(
  (task) => {
    const o = task.payload;
    const key = `cancelled:${o.order_id}`;
    if (kv.get<boolean>(key) !== undefined) {
      return; // cancelled by an earlier run
    }
    kv.set(key, true, REMEMBER_MS);
    emit('order', { type: 'order_cancelled', order_id: o.order_id, user_id: o.user_id });
  },
  { payload: fields({ order_id: 'string', user_id: 'string' }) },
);

/** The runner asks it when a task is scheduled: a payload without `user_id` is refused then. */
export const check = handle.check;
export const payloadSchema = handle.payloadSchema;
