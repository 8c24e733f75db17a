/**
 * The worker's public types: what a handler gets, the options, the stats,
 * and the default logger (stderr).
 */
import type { ClaimedChild } from "./client.js";
/** What a handler gets: the claimed child (wire names) and the claim holding it. */
export type Child<P = unknown> = Omit<ClaimedChild, "payload"> & {
    payload: P;
    claim_id: string;
};
export type Handler<P = unknown, R = unknown> = (child: Child<P>) => R | Promise<R>;
/** A function returning the parsed payload, or a zod-style schema with `parse`. */
export type Validator<P> = ((payload: unknown) => P) | {
    parse(payload: unknown): P;
};
export interface Logger {
    info(message: string): void;
    warn(message: string): void;
    error(message: string): void;
}
export interface WorkerOptions<P = unknown> {
    /** Handlers running at once (default 8). */
    concurrency?: number;
    /** Children per claim (default: concurrency, at most 1000). */
    batch?: number;
    /** Lease per claim; extended every third of it (default 60). */
    leaseSeconds?: number;
    /** Long poll of a claim that finds nothing (default 10; 1 with exitWhenEmpty). */
    waitSeconds?: number;
    /** On stop, how long handlers in flight get to finish (default 30). */
    graceSeconds?: number;
    /** Outcomes waiting longer than this for a claim to ride on are posted alone (default 0.2). */
    flushSeconds?: number;
    /** Worker name sent with claims (default `node-<host>-<pid>`). */
    name?: string;
    validate?: Validator<P>;
    /** Stop once a claim comes back empty and nothing is in hand. */
    exitWhenEmpty?: boolean;
    /** Stop on SIGTERM/SIGINT while run() runs (default true). */
    handleSignals?: boolean;
    logger?: Logger;
}
export interface WorkerStats {
    claims: number;
    claimed: number;
    processed: number;
    failed: number;
    skipped: number;
    /** Given back: by a handler's error, or unstarted when stopping. */
    released: number;
    /** Outcome writes answered duplicate/conflict/…: the first terminal write won. */
    not_applied: number;
    /** Left to their lease (an outcome or release that could not be recorded, a lost lease). */
    abandoned: number;
    /** Handler errors other than Failed/Skipped (each released, or failed on its last attempt). */
    errors: number;
}
export declare const stderrLogger: (verbose?: boolean) => Logger;
