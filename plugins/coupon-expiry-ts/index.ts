// `coupon-expiry-ts`: the coupon-expiry sample in TypeScript. Scheduled at `expires_at` − 2 h;
// emits a `coupon_expiring` event on the `push` topic (byte for byte what the Rust sample emits).
import { Outcome, emit, handler } from '@eggtimer/sdk';

interface Coupon {
  coupon_id: string;
  user_id: string;
  expires_at: number;
}

export const handle = handler<Coupon>((task) => {
  const c = task.payload;
  if (typeof c?.coupon_id !== 'string' || typeof c.user_id !== 'string' || typeof c.expires_at !== 'number') {
    // as the Rust sample: a payload that does not fit fails at once (retrying would not help)
    return Outcome.fail(`the payload does not fit this plugin: ${JSON.stringify(c)}`);
  }
  emit('push', {
    type: 'coupon_expiring',
    coupon_id: c.coupon_id,
    user_id: c.user_id,
    expires_at: c.expires_at,
  });
});
