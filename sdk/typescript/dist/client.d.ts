/**
 * The client: `new Ledger(url, {token})`, one typed method per operation of
 * the contract, plus `register`, `watch`, `wait` and `results`.
 */
import type { components, operations } from "./schema.js";
import { type SendOptions, type Transport } from "./http.js";
import { type ChildInput, type RegisterSettings } from "./producer.js";
import { type LedgerEvent, type WatchOptions } from "./events.js";
type S = components["schemas"];
type Json<R> = R extends {
    content: {
        "application/json": infer B;
    };
} ? B : never;
type Answer<K extends keyof operations> = {
    [C in 200 | 201 | 202]: C extends keyof operations[K]["responses"] ? Json<operations[K]["responses"][C]> : never;
}[200 | 201 | 202];
export type Parent = S["Parent"];
export type ParentList = S["ParentList"];
export type Counts = S["Counts"];
export type Verdict = S["Verdict"];
export type ChildSpec = S["ChildSpec"];
export type AppendChild = S["AppendChild"];
export type Appended = S["Appended"];
export type RegisterParent = S["RegisterParent"];
export type ClaimChildren = S["ClaimChildren"];
export type Claim = S["Claim"];
export type ClaimedChild = S["ClaimedChild"];
export type BatchOutcome = S["BatchOutcome"];
export type BatchResult = S["BatchResult"];
export type BatchResults = S["BatchResults"];
export type RecordOutcome = S["RecordOutcome"];
export type OutcomeRecorded = Answer<"recordOutcome">;
export type Extended = S["Extended"];
export type Released = S["Released"];
export type ReleaseChild = S["ReleaseChild"];
export type ResultRow = S["ChildResult"];
export type ChildState = S["ChildState"];
export type Summary = Answer<"parentSummary">;
export type Cancelled = Answer<"cancelParent">;
export type Retried = Answer<"retryChildren">;
export type ChildRetried = Answer<"retryChild">;
export type Redriven = Answer<"redriveParent">;
export type ReconcileReport = Answer<"reconcileParent">;
export type Queue = Answer<"getQueue">;
export type QueuePause = S["QueuePause"];
export type QueueLimits = S["QueueLimits"];
export type KeyLimits = S["KeyLimits"];
export type SetQueueLimits = S["SetQueueLimits"];
export type SetLimits = S["SetLimits"];
export type Child = S["Child"];
export type ChildList = S["ChildList"];
export type ListParentsQuery = NonNullable<operations["listParents"]["parameters"]["query"]>;
export interface LedgerOptions {
    /** Bearer token (default: LEDGER_TOKEN). */
    token?: string;
    /** Per request try, in ms (default 30000). */
    timeoutMs?: number;
    /** Retries of refused connections, timeouts, 429, 502, 503, 504 (default 4). */
    retries?: number;
    /** A fetch to use instead of the global one. */
    fetch?: typeof fetch;
}
export declare class Ledger {
    /** The service's base URL, without a trailing slash. */
    readonly url: string;
    /** @internal */
    readonly transport: Transport;
    constructor(url?: string, options?: LedgerOptions);
    /** Sends a request and resolves with its JSON answer (retrying what may get better). */
    request<T = unknown>(method: string, path: string, options?: SendOptions): Promise<T>;
    private get;
    private post;
    /**
     * Registers a parent with its children (an array, iterable, generator or
     * async iterable of child specs): one PUT when they fit one page, else
     * PUT + appended pages + seal. Safe to repeat.
     */
    register(parentId: string, queue: string, children: ChildInput, settings?: RegisterSettings): Promise<Parent>;
    /** Appends children (explicit sequences) to a decomposing parent. */
    append(parentId: string, children: AppendChild[]): Promise<Appended>;
    /** Marks a decomposing parent decomposed once sequences 0..total-1 exist. */
    seal(parentId: string, total: number): Promise<Parent>;
    getParent(parentId: string, options?: {
        include?: "payload";
    }): Promise<Parent>;
    listParents(query?: ListParentsQuery): Promise<ParentList>;
    /** One page of a parent's children in sequence order (`after`: the last sequence of the previous page). */
    listChildren(parentId: string, query?: {
        state?: ChildState;
        after?: number;
        limit?: number;
    }): Promise<ChildList>;
    /** One child row: state, lease, outcome, conflicts. */
    getChild(parentId: string, sequence: number): Promise<Child>;
    /** Counts by state and the most frequent failure and skip reasons. */
    summary(parentId: string): Promise<Summary>;
    /** Cancels a parent: every open child becomes skipped with this reason. */
    cancel(parentId: string, reason: string): Promise<Cancelled>;
    /** Retries one child (`sequence`) or every child in `states`. */
    retry(parentId: string, options: {
        sequence: number;
    } | {
        states: ChildState[];
    }): Promise<Retried | ChildRetried>;
    /** Registers a new parent `into` from this one's selected children. */
    redrive(parentId: string, options: {
        into: string;
        states?: ChildState[];
        reasons?: string[];
        dryRun?: boolean;
        queue?: string;
        priority?: number;
    }): Promise<Redriven>;
    /** Compares (and with `dryRun: false` repairs) a parent's stored projection. Default: a dry run. */
    reconcile(parentId: string, options?: {
        dryRun?: boolean;
    }): Promise<ReconcileReport>;
    pause(queue: string): Promise<QueuePause>;
    resume(queue: string): Promise<QueuePause>;
    getQueue(queue: string): Promise<Queue>;
    /** A queue's limits, or one flow key's (`key`). */
    limits(queue: string, options?: {
        key?: string;
    }): Promise<QueueLimits | KeyLimits>;
    /** Sets a queue's limits, or one flow key's (`key`). */
    setLimits(queue: string, limits: SetQueueLimits | SetLimits, options?: {
        key?: string;
    }): Promise<QueueLimits | KeyLimits>;
    claim(queue: string, body?: ClaimChildren, options?: SendOptions): Promise<Claim>;
    extend(claimId: string, leaseSeconds?: number): Promise<Extended>;
    /** Gives children back (all the claim holds when `children` is omitted). */
    release(claimId: string, children?: ReleaseChild[], options?: {
        delaySeconds?: number;
    }): Promise<Released>;
    /** Records up to 1000 outcomes; one result per item, in order. */
    recordOutcomes(outcomes: BatchOutcome[], options?: {
        traceparent?: string;
    }): Promise<BatchResults>;
    recordOutcome(parentId: string, sequence: number, outcome: RecordOutcome): Promise<OutcomeRecorded>;
    /** A parent's events until (and including) its `completed`, reconnecting as needed. */
    watch(parentId: string, options?: WatchOptions): AsyncIterable<LedgerEvent>;
    /** A queue's events; never ends by itself (abort with `signal`). */
    watchQueue(queue: string, options?: WatchOptions): AsyncIterable<LedgerEvent>;
    /** Resolves with the parent once complete (with its `verdict`). */
    wait(parentId: string, options?: {
        timeoutMs?: number;
        signal?: AbortSignal;
    }): Promise<Parent>;
    /** Each child's outcome row, streamed (NDJSON) in sequence order. */
    results(parentId: string, options?: {
        state?: ChildState;
        signal?: AbortSignal;
    }): AsyncIterable<ResultRow>;
}
export {};
