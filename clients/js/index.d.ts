// Types of @eggtimer/client. Times are milliseconds since the Unix epoch.

export class EggtimerError extends Error {
  /** The HTTP status, or 0 when eggtimer was unreachable. */
  readonly status: number;
  /** The API's error code: `bad_request`, `not_found`, `conflict`, `duplicate`, `quota_exceeded`, ... */
  readonly code: string;
  readonly message: string;
}

export type TaskState = 'scheduled' | 'running' | 'done' | 'dead';

export interface Task<P = unknown> {
  id: string;
  plugin: string;
  payload: P;
  run_at: number;
  owner?: string;
  max_attempts: number;
  state: TaskState;
  attempts: number;
  last_error?: string;
  created_at: number;
  finished_at?: number;
  traceparent?: string;
  /** The events it listens for. */
  on?: { topic: string; key: string; then: 'cancel' | 'run' }[];
  /** The event that made it run, if one did. */
  event?: { id: string; topic: string; key: string; at: number; data?: unknown };
  /** A debounced task's payloads, oldest first. */
  batch?: unknown[];
  /** 1 to 9 (absent: 0). */
  priority?: number;
}

/** What scheduling answers: the task's id (generated when you gave none) and its due time. */
export interface Scheduled {
  id: string;
  run_at: number;
  /** An event of its lookback that was already there: the task was cancelled at once
   * (`cancel`) or runs now with it (`run`). */
  met?: { topic: string; key: string; then: 'cancel' | 'run' };
}

/** What scheduling a debounced task answers: its id (the debounce key) and what became of it:
 *  `new` (a window, due in quiet_ms), `merged` (joined the waiting task, which moved) or `queued`
 *  (the task runs, so the payload waits for its next window). No due time: a queued payload's
 *  window starts when the run ends. */
export interface Debounced {
  id: string;
  debounced: 'new' | 'merged' | 'queued';
}

type DebounceWindow = { key: string; quiet_ms: number; max_wait_ms: number };

/** When and how a task runs: `run_at` or `delay_ms` (neither: now). */
export interface ScheduleOptions {
  run_at?: number;
  delay_ms?: number;
  /** The same id again replaces a task that has not started. */
  id?: string;
  owner?: string;
  max_attempts?: number;
  /** Once the task finished, the same id is refused (409 `duplicate`) for this long. */
  unique_for_ms?: number;
  traceparent?: string;
  /** Events it listens for: `cancel` cancels it, `run` runs it at once with the event. */
  on?: { topic: string; key: string; then: 'cancel' | 'run' }[];
  /** An event up to this long before it was scheduled still matches (default 60,000). */
  lookback_ms?: number;
  /** One task per key: scheduling again within quiet_ms moves it and keeps every payload. */
  debounce?: DebounceWindow;
  /** 0 (default) to 9: among its plugin's due tasks, the higher starts first. Not with debounce. */
  priority?: number;
}

export interface TaskSpec extends ScheduleOptions {
  plugin: string;
  payload?: unknown;
}

export interface ScheduleSpec {
  cron?: string;
  every_ms?: number;
  tz?: string;
  owner?: string;
  start_at?: number;
  end_at?: number;
  max_attempts?: number;
  overlap?: 'skip' | 'allow';
}

export interface Schedule extends ScheduleSpec {
  id: string;
  plugin: string;
  payload: unknown;
  tz: string;
  max_attempts: number;
  overlap: 'skip' | 'allow';
  paused: boolean;
  /** null: never again, or paused. */
  next_run_at: number | null;
  /** The task id of its latest firing. */
  last_task_id: string | null;
  /** Its next 5 fire times (getSchedule only). */
  upcoming?: number[];
}

/** What of an owner is paused: all its tasks, or those of some plugins. */
export interface OwnerPauses {
  all: boolean;
  plugins: string[];
}

/** An owner's tasks per plugin (of the plugins the key sees), and its pauses. */
export interface OwnerStats {
  owner: string;
  /** `pending`: what the plugin's max_pending_per_owner counts of the owner. */
  plugins: { plugin: string; scheduled: number; running: number; dead: number; pending: number }[];
  scheduled: number;
  running: number;
  dead: number;
  paused: OwnerPauses;
}

export interface ClientOptions {
  /** Default `http://127.0.0.1:8080`; any runner of a namespace serves all of it. */
  url?: string;
  /** An API key (`et_...`) or the admin token. */
  token?: string;
  /** Per request; default 10 s. */
  timeoutMs?: number;
  /** The plugin whose tasks the calls by task id name (see `inPlugin`). */
  plugin?: string;
}

export class Client {
  constructor(options?: ClientOptions);
  /** A client whose calls by task id (get, move, cancel, runNow) name the task of this plugin:
   *  needed only where plugins your key may see each have a task of one id (else 409
   *  `ambiguous_id`). */
  inPlugin(plugin: string): Client;
  /** A debounced task (`debounce` given) is answered `{id, debounced}`, any other `{id, run_at}`. */
  schedule(plugin: string, payload: unknown, options: ScheduleOptions & { debounce: DebounceWindow }): Promise<Debounced>;
  schedule(plugin: string, payload?: unknown, options?: ScheduleOptions & { debounce?: undefined }): Promise<Scheduled>;
  /** Up to 10,000 at once, all or none (an error names the refused index); all debounced or none. */
  scheduleMany(specs: (TaskSpec & { debounce: DebounceWindow })[]): Promise<Debounced[]>;
  scheduleMany(specs: (TaskSpec & { debounce?: undefined })[]): Promise<Scheduled[]>;
  /** The task, or null when there is none. */
  get<P = unknown>(id: string): Promise<Task<P> | null>;
  move(id: string, to: { runAt: number } | { shiftMs: number }): Promise<Scheduled>;
  /** true if it was cancelled, false if there was no such task. */
  cancel(id: string): Promise<boolean>;
  runNow(id: string): Promise<void>;
  /** Every scheduled task of the owner, soonest first, page by page. */
  ownerTasks(owner: string): AsyncGenerator<Task, void, undefined>;
  shiftOwner(owner: string, shiftMs: number, plugin?: string): Promise<number>;
  cancelOwner(owner: string, plugin?: string): Promise<number>;
  /** Pauses the owner's tasks (of one plugin, if given): they wait, scheduled, until resumed. */
  pauseOwner(owner: string, plugin?: string): Promise<OwnerPauses>;
  /** Resumes the owner's tasks (of one plugin; without one, every pause); how many were put back. */
  resumeOwner(owner: string, plugin?: string): Promise<number>;
  /** The owner's scheduled, running and dead tasks per plugin, and its pauses. */
  ownerStats(owner: string): Promise<OwnerStats>;
  /** Publishes an event: the tasks listening on `topic` with `key` are cancelled or run now; how many it reached. */
  publish(topic: string, key: string, data?: unknown): Promise<number>;
  putSchedule(id: string, plugin: string, payload?: unknown, spec?: ScheduleSpec): Promise<{ id: string; next_run_at: number | null }>;
  getSchedule(id: string): Promise<Schedule | null>;
  deleteSchedule(id: string): Promise<void>;
}
