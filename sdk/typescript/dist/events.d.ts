/**
 * Following a parent: server-sent events (parsed here over the fetch body
 * stream), resumed with Last-Event-ID after a dropped connection or a
 * restart; `wait` for the verdict; `results` streamed as NDJSON.
 */
import type { Ledger, Parent, ResultRow, ChildState } from "./client.js";
/** One server-sent event: `snapshot`, `progress`, `completed`, `paused` or `resumed`. */
export interface LedgerEvent<T = unknown> {
    event: string;
    /** The event's id (what Last-Event-ID resumes from), or null. */
    id: string | null;
    /** The event's data, parsed as JSON (the raw text when it is not JSON). */
    data: T;
}
export interface WatchOptions {
    signal?: AbortSignal;
    /** Resume after this event id. */
    lastEventId?: string;
    /** Give up (UnavailableError) after this long without a connection (default: never). */
    reconnectTimeoutMs?: number;
}
/** Server-sent events from a body stream (fields `event`, `data`, `id`; comments skipped). */
export declare function parseSse(body: ReadableStream<Uint8Array>, onChunk?: () => void): AsyncGenerator<LedgerEvent & {
    raw: string;
}>;
export declare function watchStream(ledger: Ledger, path: string, endOnCompleted: boolean, options?: WatchOptions): AsyncGenerator<LedgerEvent>;
export declare function wait(ledger: Ledger, parentId: string, options?: {
    timeoutMs?: number;
    signal?: AbortSignal;
}): Promise<Parent>;
export declare function results(ledger: Ledger, parentId: string, options?: {
    state?: ChildState;
    signal?: AbortSignal;
}): AsyncGenerator<ResultRow>;
