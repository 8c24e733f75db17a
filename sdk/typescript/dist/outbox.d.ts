/**
 * The worker's outbox: outcomes waiting for the next claim to ride on (its
 * `outcomes` member), taken up to 1000 items and ~900 KB of JSON at a time;
 * those that would wait longer than the flush interval are posted alone.
 */
import type { BatchOutcome } from "./client.js";
export declare const MAX_ITEMS = 1000;
export declare const MAX_BYTES = 900000;
export interface Taken {
    items: BatchOutcome[];
    /** The items as a JSON array. */
    json: string;
}
export declare class Outbox {
    private readonly flushMs;
    private readonly post;
    private items;
    private timer;
    /** `post` sends what `flush` takes (POST /v1/outcomes). */
    constructor(flushMs: number, post: (taken: Taken) => Promise<unknown>);
    get size(): number;
    push(item: BatchOutcome): void;
    /** Items a failed request carried go first again (a repeat is answered "duplicate"). */
    putBack(items: BatchOutcome[]): void;
    private arm;
    /** Up to 1000 outcomes and ~900 KB of their JSON, or undefined when empty. */
    take(): Taken | undefined;
    /** Posts everything waiting, now. */
    flush(): Promise<unknown>;
    close(): void;
}
