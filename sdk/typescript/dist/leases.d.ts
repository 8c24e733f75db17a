/**
 * The worker's claims in hand: extending their leases every third of the
 * lease (one timer for all), and giving children back (batched per claim,
 * at most 1000 a request).
 */
import type { ClaimedChild, Ledger } from "./client.js";
import type { Logger, WorkerStats } from "./worker-types.js";
export interface ClaimState {
    id: string;
    /** Children of this claim still in hand. */
    remaining: number;
    lost: boolean;
    /** By our clock, when the lease may run out (less a margin). */
    deadline: number;
    extendedAt: number;
    extending: boolean;
}
export declare class Leases {
    private readonly ledger;
    private readonly leaseSeconds;
    private readonly stats;
    private readonly log;
    /** Called with each request made, to be awaited when stopping. */
    private readonly track;
    /** Called once `n` children of a claim were given back (or failed to be). */
    private readonly released;
    readonly active: Set<ClaimState>;
    private readonly leaseMs;
    /** Children are not started this close to the lease's end by our clock. */
    private readonly marginMs;
    private timer;
    private releases;
    private scheduled;
    constructor(ledger: Ledger, leaseSeconds: number, stats: WorkerStats, log: Logger, 
    /** Called with each request made, to be awaited when stopping. */
    track: (p: Promise<unknown>) => void, 
    /** Called once `n` children of a claim were given back (or failed to be). */
    released: (claim: ClaimState, n: number) => void);
    start(): void;
    stop(): void;
    /** A claim just answered with `count` children. */
    add(id: string, count: number, sentAt: number): ClaimState;
    private extend;
    /** Gives a child back soon (batched with others of its claim). */
    release(child: ClaimedChild, claim: ClaimState): void;
    /** Sends the releases waiting, now (delay 0: the service applies the parent's retry_backoff). */
    flush(): Promise<unknown>;
}
