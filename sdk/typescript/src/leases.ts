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

const message = (err: unknown) => (err instanceof Error ? err.message : String(err));

export class Leases {
  readonly active = new Set<ClaimState>();
  private readonly leaseMs: number;
  /** Children are not started this close to the lease's end by our clock. */
  private readonly marginMs: number;
  private timer: NodeJS.Timeout | undefined;
  private releases = new Map<ClaimState, ClaimedChild[]>();
  private scheduled = false;

  constructor(
    private readonly ledger: Ledger,
    private readonly leaseSeconds: number,
    private readonly stats: WorkerStats,
    private readonly log: Logger,
    /** Called with each request made, to be awaited when stopping. */
    private readonly track: (p: Promise<unknown>) => void,
    /** Called once `n` children of a claim were given back (or failed to be). */
    private readonly released: (claim: ClaimState, n: number) => void,
  ) {
    this.leaseMs = leaseSeconds * 1000;
    this.marginMs = Math.min(1000, this.leaseMs / 4);
  }

  start(): void {
    this.timer = setInterval(() => this.extend(), Math.max(250, this.leaseMs / 6));
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** A claim just answered with `count` children. */
  add(id: string, count: number, sentAt: number): ClaimState {
    const claim: ClaimState = {
      id, remaining: count, lost: false, deadline: sentAt + this.leaseMs - this.marginMs, extendedAt: sentAt, extending: false,
    };
    this.active.add(claim);
    return claim;
  }

  private extend(): void {
    const now = performance.now();
    const every = this.leaseMs / 3;
    for (const claim of this.active) {
      if (claim.extending || claim.lost || now - claim.extendedAt < every) continue;
      claim.extending = true;
      const sent = performance.now();
      const p = this.ledger.extend(claim.id, this.leaseSeconds).then((answer) => {
        if (answer.extended === 0) {
          if (claim.remaining > 0) this.log.warn(`claim ${claim.id} holds nothing any more: its lease ran out`);
          claim.lost = true;
        } else {
          claim.extendedAt = sent;
          claim.deadline = sent + this.leaseMs - this.marginMs;
        }
      }, (err) => this.log.warn(`extend ${claim.id}: ${message(err)}`))
        .finally(() => { claim.extending = false; });
      this.track(p);
    }
  }

  /** Gives a child back soon (batched with others of its claim). */
  release(child: ClaimedChild, claim: ClaimState): void {
    const list = this.releases.get(claim);
    if (list) list.push(child);
    else this.releases.set(claim, [child]);
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => {
        this.scheduled = false;
        void this.flush();
      });
    }
  }

  /** Sends the releases waiting, now (delay 0: the service applies the parent's retry_backoff). */
  flush(): Promise<unknown> {
    const pending = this.releases;
    this.releases = new Map();
    const all: Promise<unknown>[] = [];
    for (const [claim, children] of pending) {
      for (let i = 0; i < children.length; i += 1000) {
        const refs = children.slice(i, i + 1000).map((c) => ({ parent_id: c.parent_id, sequence: c.sequence }));
        const p = this.ledger.release(claim.id, refs, { delaySeconds: 0 }).then((answer) => {
          this.stats.released += answer.released;
          this.stats.abandoned += refs.length - answer.released;
        }, (err) => {
          this.stats.abandoned += refs.length;
          this.log.warn(`release ${claim.id}: ${message(err)} (the children come back when the lease runs out)`);
        }).finally(() => this.released(claim, refs.length));
        this.track(p);
        all.push(p);
      }
    }
    return Promise.all(all);
  }
}
