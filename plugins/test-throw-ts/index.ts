// Test plugin: throws `new Error(payload.message)`: a thrown exception is a failed attempt. With
// `priority` instead, it schedules a follow-up of itself an hour ahead (of the task's owner) with
// that priority, through the SDK's `schedule`, and is done.
import { handler, now, schedule } from '@eggtimer/sdk';

export const handle = handler<{ message?: string; priority?: number }>((task) => {
  if (task.payload.priority !== undefined) {
    schedule({
      plugin: 'test-throw-ts',
      payload: { message: 'a follow-up' },
      at: now() + 3_600_000,
      owner: task.owner,
      priority: task.payload.priority,
    });
    return;
  }
  throw new Error(task.payload.message);
});
