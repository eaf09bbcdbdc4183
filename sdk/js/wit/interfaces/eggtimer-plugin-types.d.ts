declare module 'eggtimer:plugin/types@0.1.0' {
  /**
   * The task being run.
   */
  export interface Task {
    id: string,
    plugin: string,
    /**
     * 1 for the first attempt.
     */
    attempt: number,
    maxAttempts: number,
    /**
     * Due time, ms since the Unix epoch.
     */
    due: bigint,
    owner?: string,
    /**
     * The payload as JSON text.
     */
    payload: string,
  }
  /**
   * What the handler decided.
   */
  export type Outcome = OutcomeDone | OutcomeRetryAfter | OutcomeFail | OutcomeRunAgainAt;
  /**
   * Finished.
   */
  export interface OutcomeDone {
    tag: 'done',
  }
  /**
   * Try again after this many ms (counts as a failed attempt).
   */
  export interface OutcomeRetryAfter {
    tag: 'retry-after',
    val: bigint,
  }
  /**
   * Give up: dead-letter the task with this reason.
   */
  export interface OutcomeFail {
    tag: 'fail',
    val: string,
  }
  /**
   * Run this same task again at this time (ms since the epoch).
   */
  export interface OutcomeRunAgainAt {
    tag: 'run-again-at',
    val: bigint,
  }
  /**
   * A task to schedule from inside a handler.
   */
  export interface FollowUp {
    plugin: string,
    /**
     * JSON text.
     */
    payload: string,
    /**
     * ms since the Unix epoch.
     */
    runAt: bigint,
    owner?: string,
    maxAttempts?: number,
  }
  /**
   * # Variants
   * 
   * ## `"debug"`
   * 
   * ## `"info"`
   * 
   * ## `"warn"`
   * 
   * ## `"error"`
   */
  export type Level = 'debug' | 'info' | 'warn' | 'error';
  /**
   * An HTTP request a plugin sends through the host.
   */
  export interface HttpRequest {
    /**
     * GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS.
     */
    method: string,
    /**
     * `http(s)://host[:port]/path?query`: its origin must be in the plugin's allowed_hosts.
     */
    url: string,
    headers: Array<[string, string]>,
    body: Uint8Array,
  }
  /**
   * The answer to an [`http-request`] (redirects are returned, not followed).
   */
  export interface HttpResponse {
    status: number,
    headers: Array<[string, string]>,
    body: Uint8Array,
  }
}
