import type { Ledger } from "./client.js";
import { stderrLogger, type Child, type Handler, type Logger, type WorkerOptions, type WorkerStats } from "./worker-types.js";
export { stderrLogger };
export type { Child, Handler, Logger, WorkerOptions, WorkerStats };
export type { Validator } from "./worker-types.js";
export declare class Worker<P = unknown, R = unknown> {
    private readonly ledger;
    private readonly handler;
    readonly queue: string;
    readonly name: string;
    readonly stats: WorkerStats;
    private readonly concurrency;
    private readonly batch;
    private readonly capacity;
    private readonly leaseSeconds;
    private readonly waitSeconds;
    private readonly graceMs;
    private readonly exitWhenEmpty;
    private readonly handleSignals;
    private readonly log;
    private readonly validate;
    private readonly claimPath;
    private readonly claimHead;
    private inHand;
    private asked;
    private claimsOut;
    private running;
    private idle;
    private failures;
    private pumping;
    private ready;
    private readonly outbox;
    private backoffTimer;
    private readonly leases;
    private readonly flights;
    /** Claims out: what aborts each, and when it was sent. */
    private readonly claimAborts;
    /** Outcomes sent again after their request failed: "duplicate" is then their own earlier write. */
    private readonly resent;
    /** A signal for requests that nothing aborts. */
    private readonly never;
    private readonly posts;
    private readonly maxAttempts;
    private traced;
    private started;
    private stopping;
    private fatal;
    private wakeGrace;
    private finished;
    private resolveRun;
    private rejectRun;
    private readonly onSignal;
    constructor(ledger: Ledger, queue: string, handler: Handler<P, R>, options?: WorkerOptions<P>);
    /** Works until stopped: resolves with the stats; rejects with the ProblemError of a claim refused with a 4xx. */
    run(): Promise<WorkerStats>;
    /** Stops: no new claims, unstarted children released, in-flight ones get the grace period. */
    stop(): Promise<WorkerStats>;
    private maybeClaim;
    private sendClaim;
    private onClaim;
    private onClaimError;
    private pause;
    /** A claim refused with a 4xx (or something else we cannot fix): stop at once. */
    private die;
    private pump;
    private start;
    private settled;
    private processed;
    private failed;
    /** The parent's max_attempts (read once per parent, cached; null: unlimited or unknown). */
    private maxAttemptsOf;
    /** One child fewer in hand (n fewer). */
    private finish;
    private record;
    /** POST /v1/outcomes for what the outbox could not send with a claim. */
    private postOutcomes;
    /** Retries what may get better (connections, 429, 5xx) a few times: outcome writes are safe to repeat. */
    private retrying;
    private track;
    private countResults;
    /** Gives back every child in hand that has not started. */
    private releaseUnstarted;
    private shutdown;
}
