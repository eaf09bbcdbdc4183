// Test plugin: throws `new Error(payload.message)`: a thrown exception is a failed attempt.
import { handler } from '@eggtimer/sdk';

export const handle = handler<{ message: string }>((task) => {
  throw new Error(task.payload.message);
});
