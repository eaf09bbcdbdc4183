/// <reference path="./interfaces/eggtimer-plugin-host.d.ts" />
/// <reference path="./interfaces/eggtimer-plugin-types.d.ts" />
declare module 'eggtimer:plugin/plugin@0.1.0' {
  export type Task = import('eggtimer:plugin/types@0.1.0').Task;
  export type Outcome = import('eggtimer:plugin/types@0.1.0').Outcome;
  export type * as EggtimerPluginHost010 from 'eggtimer:plugin/host@0.1.0'; // import eggtimer:plugin/host@0.1.0
  export type * as EggtimerPluginTypes010 from 'eggtimer:plugin/types@0.1.0'; // import eggtimer:plugin/types@0.1.0
  /**
  * Runs one task. An error is a failed attempt: retried with backoff, then dead-lettered.
  */
  export function handle(task: Task): Outcome;
  export type Result<T, E> = { tag: 'ok', val: T } | { tag: 'err', val: E };
}
