import type { Outcome } from 'eggtimer:plugin/types@0.1.0';

export declare function deriveId(parent: string, occurrence: number, index: number): string;

export declare function idempotencyKey(task: string, occurrence: number, index: number): string;

export declare class TestHost {
  now: number;
  config: Record<string, string>;
  secrets: Record<string, string>;
  httpResponses: ({ status: number; headers?: [string, string][]; body?: string } | Error)[];
  httpRequests: { method: string; url: string; headers: [string, string][]; body: string }[];
  events: [string, unknown][];
  scheduled: [string, { plugin: string; payload: unknown; runAt: number; owner?: string; maxAttempts?: number; priority?: number }][];
  cancelled: string[];
  logs: [string, string][];
  run(
    handle: (task: any) => Outcome,
    payload: unknown,
    opts?: { id?: string; attempt?: number; maxAttempts?: number; due?: number; owner?: string; event?: unknown; batch?: unknown[] },
  ): Outcome;
  kv<T = unknown>(key: string): T | undefined;
}
