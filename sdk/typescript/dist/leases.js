const message = (err) => (err instanceof Error ? err.message : String(err));
export class Leases {
    ledger;
    leaseSeconds;
    stats;
    log;
    track;
    released;
    active = new Set();
    leaseMs;
    /** Children are not started this close to the lease's end by our clock. */
    marginMs;
    timer;
    releases = new Map();
    scheduled = false;
    constructor(ledger, leaseSeconds, stats, log, 
    /** Called with each request made, to be awaited when stopping. */
    track, 
    /** Called once `n` children of a claim were given back (or failed to be). */
    released) {
        this.ledger = ledger;
        this.leaseSeconds = leaseSeconds;
        this.stats = stats;
        this.log = log;
        this.track = track;
        this.released = released;
        this.leaseMs = leaseSeconds * 1000;
        this.marginMs = Math.min(1000, this.leaseMs / 4);
    }
    start() {
        this.timer = setInterval(() => this.extend(), Math.max(250, this.leaseMs / 6));
    }
    stop() {
        clearInterval(this.timer);
    }
    /** A claim just answered with `count` children. */
    add(id, count, sentAt) {
        const claim = {
            id, remaining: count, lost: false, deadline: sentAt + this.leaseMs - this.marginMs, extendedAt: sentAt, extending: false,
        };
        this.active.add(claim);
        return claim;
    }
    extend() {
        const now = performance.now();
        const every = this.leaseMs / 3;
        for (const claim of this.active) {
            if (claim.extending || claim.lost || now - claim.extendedAt < every)
                continue;
            claim.extending = true;
            const sent = performance.now();
            const p = this.ledger.extend(claim.id, this.leaseSeconds).then((answer) => {
                if (answer.extended === 0) {
                    if (claim.remaining > 0)
                        this.log.warn(`claim ${claim.id} holds nothing any more: its lease ran out`);
                    claim.lost = true;
                }
                else {
                    claim.extendedAt = sent;
                    claim.deadline = sent + this.leaseMs - this.marginMs;
                }
            }, (err) => this.log.warn(`extend ${claim.id}: ${message(err)}`))
                .finally(() => { claim.extending = false; });
            this.track(p);
        }
    }
    /** Gives a child back soon (batched with others of its claim). */
    release(child, claim) {
        const list = this.releases.get(claim);
        if (list)
            list.push(child);
        else
            this.releases.set(claim, [child]);
        if (!this.scheduled) {
            this.scheduled = true;
            setImmediate(() => {
                this.scheduled = false;
                void this.flush();
            });
        }
    }
    /** Sends the releases waiting, now (delay 0: the service applies the parent's retry_backoff). */
    flush() {
        const pending = this.releases;
        this.releases = new Map();
        const all = [];
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
