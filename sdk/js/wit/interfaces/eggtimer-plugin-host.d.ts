/// <reference path="./eggtimer-plugin-types.d.ts" />
declare module 'eggtimer:plugin/host@0.1.0' {
  export function log(level: Level, message: string): void;
  /**
   * The host's clock, ms since the Unix epoch.
   */
  export function now(): bigint;
  /**
   * Schedules a follow-up task; returns its id, derived from this task's id, its occurrence
   * (when it was scheduled) and the number of follow-ups scheduled so far in this run, so a
   * re-run of the same occurrence never schedules it twice.
   */
  export function schedule(task: FollowUp): string;
  /**
   * `schedule` with a priority of its own, 0 (lowest) to 9 (highest): among tasks due, a
   * claim takes the higher first. A follow-up scheduled with `schedule` has its task's
   * priority. Above 9 is an error.
   */
  export function scheduleWithPriority(task: FollowUp, priority: number): string;
  /**
   * Cancels a scheduled task of this plugin (no error if it does not exist or is another
   * plugin's: that one is left alone).
   */
  export function cancel(id: string): void;
  /**
   * Appends an event (`data`: JSON text) to the topic's stream.
   */
  export function emit(topic: string, data: string): void;
  /**
   * The plugin's own key-value store.
   */
  export function kvGet(key: string): string | undefined;
  export function kvSet(key: string, value: string, ttlMs: bigint | undefined): void;
  export function kvDelete(key: string): void;
  /**
   * A value of the plugin's `config` setting.
   */
  export function config(name: string): string | undefined;
  /**
   * One of the plugin's secrets (set with `PUT /v1/plugins/{name}/secrets/{key}`).
   */
  export function secret(name: string): string | undefined;
  /**
   * Sends an HTTP request now (not after the handler returns) to an origin in the plugin's
   * allowed_hosts. It carries an `Idempotency-Key` the same on every attempt and rerun of this
   * occurrence (unless the request sets one). An error names what was refused or failed.
   */
  export function httpSend(request: HttpRequest): HttpResponse;
  /**
   * The event that made this task run (JSON text `{"id", "topic", "key", "at", "data"}`), if
   * one did: the task listened for it (`on` with `then: run`). None when it ran at its due
   * time.
   */
  export function event(): string | undefined;
  /**
   * A debounced task's payloads (JSON texts), oldest first, at most 1,000; empty for a task
   * that is not debounced. The task's payload is the latest of them.
   */
  export function batch(): Array<string>;
  export type FollowUp = import('eggtimer:plugin/types@0.1.0').FollowUp;
  export type Level = import('eggtimer:plugin/types@0.1.0').Level;
  export type HttpRequest = import('eggtimer:plugin/types@0.1.0').HttpRequest;
  export type HttpResponse = import('eggtimer:plugin/types@0.1.0').HttpResponse;
}
