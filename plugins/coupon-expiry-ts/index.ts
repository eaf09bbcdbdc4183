// `coupon-expiry-ts`: the coupon-expiry sample in TypeScript. Scheduled at `expires_at` − 2 h;
// emits a `coupon_expiring` event on the `push` topic (byte for byte what the Rust sample emits).
import { emit, fields, handler } from '@eggtimer/sdk';

interface Coupon {
  coupon_id: string;
  user_id: string;
  expires_at: number;
}

export const handle = handler<Coupon>(
  (task) => {
    const c = task.payload;
    emit('push', {
      type: 'coupon_expiring',
      coupon_id: c.coupon_id,
      user_id: c.user_id,
      expires_at: c.expires_at,
    });
  },
  // as the Rust sample's payload type: a task whose payload does not fit is refused when it is
  // scheduled (422), and fails at once if one gets through (retrying would not help)
  { payload: fields({ coupon_id: 'string', user_id: 'string', expires_at: 'integer' }) },
);

export const check = handle.check;
export const payloadSchema = handle.payloadSchema;
