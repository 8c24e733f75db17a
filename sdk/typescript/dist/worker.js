/**
 * The worker: claims children of one queue, keeps their leases, runs the
 * handler on each (at most `concurrency` at once) and records one outcome per
 * child, each chunk's outcomes riding on the next claim. See the README's
 * "Worker" section for the contract.
 */
import { hostname } from "node:os";
import { Failed, LedgerError, ProblemError, Skipped, UnavailableError } from "./errors.js";
import { backoffMs, describe, postJson, sleep } from "./http.js";
import { loadTracing } from "./otel.js";
import { Outbox } from "./outbox.js";
import { Leases } from "./leases.js";
import { stderrLogger } from "./worker-types.js";
export { stderrLogger };
const reasonOf = (err) => (err instanceof Error ? `${err.name}: ${err.message}` : String(err)).slice(0, 1000);
export class Worker {
    ledger;
    handler;
    queue;
    name;
    stats = {
        claims: 0, claimed: 0, processed: 0, failed: 0, skipped: 0, released: 0, not_applied: 0, abandoned: 0, errors: 0,
    };
    concurrency;
    batch;
    capacity;
    leaseSeconds;
    waitSeconds;
    graceMs;
    exitWhenEmpty;
    handleSignals;
    log;
    validate;
    claimPath;
    claimHead;
    inHand = 0;
    asked = 0;
    claimsOut = 0;
    running = 0;
    idle = false;
    failures = 0;
    pumping = false;
    ready = [];
    outbox;
    backoffTimer;
    leases;
    flights = new Set();
    /** Claims out: what aborts each, and when it was sent. */
    claimAborts = new Map();
    /** Outcomes sent again after their request failed: "duplicate" is then their own earlier write. */
    resent = new WeakSet();
    /** A signal for requests that nothing aborts. */
    never = new AbortController();
    posts = new Set();
    maxAttempts = new Map();
    traced;
    started = false;
    stopping = false;
    fatal;
    wakeGrace;
    finished;
    resolveRun;
    rejectRun;
    onSignal = (signal) => {
        if (!this.stopping) {
            this.log.warn(`${signal}: stopping (releasing unstarted children, ${this.graceMs / 1000}s grace for those in flight)`);
            void this.stop();
        }
        else {
            this.log.warn(`${signal} again: ending the grace period now`);
            this.wakeGrace?.();
        }
    };
    constructor(ledger, queue, handler, options = {}) {
        this.ledger = ledger;
        this.handler = handler;
        this.queue = queue;
        this.concurrency = Math.max(1, Math.floor(options.concurrency ?? 8));
        this.batch = Math.max(1, Math.min(1000, Math.floor(options.batch ?? this.concurrency)));
        this.capacity = Math.max(this.concurrency, this.batch);
        this.leaseSeconds = options.leaseSeconds ?? 60;
        this.exitWhenEmpty = options.exitWhenEmpty ?? false;
        this.waitSeconds = options.waitSeconds ?? (this.exitWhenEmpty ? 1 : 10);
        this.graceMs = (options.graceSeconds ?? 30) * 1000;
        this.outbox = new Outbox((options.flushSeconds ?? 0.2) * 1000, (taken) => this.postOutcomes(taken));
        this.handleSignals = options.handleSignals ?? true;
        this.name = options.name ?? `node-${hostname()}-${process.pid}`;
        this.log = options.logger ?? stderrLogger();
        this.leases = new Leases(ledger, this.leaseSeconds, this.stats, this.log, (p) => this.track(p), (claim, n) => {
            this.finish(claim, n);
            if (!this.stopping)
                this.pump();
        });
        const v = options.validate;
        this.validate = v === undefined ? undefined : typeof v === "function" ? v : (p) => v.parse(p);
        this.claimPath = `/v1/queues/${encodeURIComponent(queue)}/claims`;
        this.claimHead = JSON.stringify({
            lease_seconds: this.leaseSeconds, wait_seconds: this.waitSeconds, worker: this.name,
        }).slice(0, -1);
    }
    /** Works until stopped: resolves with the stats; rejects with the ProblemError of a claim refused with a 4xx. */
    run() {
        if (this.started)
            throw new LedgerError("Worker.run() was already called");
        this.started = true;
        this.finished = new Promise((resolve, reject) => {
            this.resolveRun = resolve;
            this.rejectRun = reject;
        });
        if (this.handleSignals)
            for (const s of ["SIGTERM", "SIGINT"])
                process.on(s, this.onSignal);
        this.leases.start();
        loadTracing().then((traced) => {
            this.traced = traced;
            if (traced)
                this.log.info("OpenTelemetry: handlers run in spans");
            this.maybeClaim();
        }, () => this.maybeClaim());
        return this.finished;
    }
    /** Stops: no new claims, unstarted children released, in-flight ones get the grace period. */
    stop() {
        if (!this.started) {
            this.started = true;
            return Promise.resolve(this.stats);
        }
        if (!this.stopping)
            void this.shutdown(this.graceMs);
        return this.finished.catch(() => this.stats);
    }
    // ---- claiming
    maybeClaim() {
        if (this.stopping || this.backoffTimer)
            return;
        // Room for a claim: a whole batch when several fit in hand (every claim
        // then asks for a whole one), else half of one, so the queue never waits
        // for a chunk's slowest handler.
        const half = this.capacity >= 2 * this.batch ? this.batch : Math.ceil(this.batch / 2);
        for (;;) {
            if (this.idle && this.claimsOut > 0)
                return;
            const room = this.capacity - this.inHand - this.asked;
            if (room < half)
                return;
            this.sendClaim(Math.min(this.batch, room));
        }
    }
    sendClaim(limit) {
        this.claimsOut++;
        this.asked += limit;
        this.stats.claims++;
        const carried = this.outbox.take();
        const body = `${this.claimHead},"limit":${limit}${carried ? `,"outcomes":${carried.json}` : ""}}`;
        const abort = new AbortController();
        const sentAt = performance.now();
        this.claimAborts.set(abort, sentAt);
        postJson(this.ledger.transport, this.claimPath, body, abort.signal, (this.waitSeconds + 30) * 1000)
            .then((claim) => this.onClaim(claim, limit, carried?.items, abort, sentAt), (err) => this.onClaimError(err, limit, carried?.items, abort))
            .catch((err) => this.die(err));
    }
    onClaim(claim, limit, carried, abort, sentAt) {
        this.claimAborts.delete(abort);
        this.claimsOut--;
        this.asked -= limit;
        this.failures = 0;
        if (carried)
            this.countResults(carried, claim.outcome_results ?? []);
        const children = claim.children;
        if (children.length) {
            this.idle = false;
            const state = this.leases.add(claim.claim_id, children.length, sentAt);
            this.inHand += children.length;
            this.stats.claimed += children.length;
            if (this.stopping) {
                // It came back while stopping: give everything back at once.
                this.ready.push({ claim: state, children, next: 0 });
                void this.releaseUnstarted();
                return;
            }
            this.ready.push({ claim: state, children, next: 0 });
            this.pump();
            return;
        }
        this.idle = true;
        if (this.stopping)
            return;
        if (this.exitWhenEmpty && this.inHand === 0 && this.claimsOut === 0) {
            this.log.info("nothing claimable and nothing in hand: stopping");
            void this.shutdown(this.graceMs);
            return;
        }
        if (this.waitSeconds === 0)
            this.pause(500);
        else
            this.maybeClaim();
    }
    onClaimError(err, limit, carried, abort) {
        this.claimAborts.delete(abort);
        this.claimsOut--;
        this.asked -= limit;
        if (carried) {
            for (const item of carried)
                this.resent.add(item);
            this.outbox.putBack(carried); // sent again: a repeat of an applied write is answered "duplicate"
        }
        if (this.stopping && abort.signal.aborted)
            return;
        // Refused or lost connections, timeouts, 429 and 5xx may get better: retried without limit.
        const retryable = err instanceof UnavailableError
            || (err instanceof ProblemError && (err.status === 429 || err.status >= 500));
        if (!retryable) {
            this.die(err);
            return;
        }
        this.idle = true;
        const wait = (err instanceof ProblemError ? err.retryAfterMs : undefined) ?? backoffMs(this.failures++);
        this.log.warn(`claim: ${err instanceof ProblemError ? `${err.status} ${err.title}` : describe(err)}; `
            + `retrying in ${(wait / 1000).toFixed(1)}s`);
        this.pause(wait);
    }
    pause(ms) {
        if (this.backoffTimer || this.stopping)
            return;
        this.backoffTimer = setTimeout(() => {
            this.backoffTimer = undefined;
            this.maybeClaim();
        }, ms);
    }
    /** A claim refused with a 4xx (or something else we cannot fix): stop at once. */
    die(err) {
        if (this.fatal !== undefined)
            return;
        this.fatal = err;
        this.log.error(`stopping: ${err instanceof Error ? err.message : String(err)}`);
        void this.shutdown(0);
    }
    // ---- running handlers
    pump() {
        if (this.pumping)
            return;
        this.pumping = true;
        try {
            const now = performance.now();
            while (this.running < this.concurrency && !this.stopping && this.ready.length) {
                const chunk = this.ready[0];
                const { claim, children } = chunk;
                if (chunk.next >= children.length) {
                    this.ready.shift();
                    continue;
                }
                if (claim.lost || now > claim.deadline) {
                    const n = children.length - chunk.next;
                    this.log.warn(`claim ${claim.id}: lease lost; ${n} children not started (they come back to the queue)`);
                    chunk.next = children.length;
                    this.stats.abandoned += n;
                    this.finish(claim, n);
                    continue;
                }
                this.start(children[chunk.next++], claim);
            }
        }
        finally {
            this.pumping = false;
        }
        this.maybeClaim();
    }
    start(child, claim) {
        this.running++;
        const c = child;
        c.claim_id = claim.id;
        let value;
        let traceparent = child.traceparent ?? undefined;
        try {
            let input = c;
            if (this.validate) {
                try {
                    input = { ...c, payload: this.validate(c.payload) };
                }
                catch (err) {
                    throw new Failed(`invalid payload: ${err instanceof Error ? err.message : String(err)}`.slice(0, 1000));
                }
            }
            if (this.traced) {
                const t = this.traced(`${this.queue} process`, child.traceparent, { "child_ledger.parent_id": child.parent_id, "child_ledger.sequence": child.sequence, "child_ledger.attempt": child.attempt }, () => this.handler(input));
                value = t.value;
                traceparent = t.traceparent;
            }
            else {
                value = this.handler(input);
            }
        }
        catch (err) {
            this.running--;
            this.failed(child, claim, err, traceparent);
            return;
        }
        if (value !== null && typeof value === "object" && typeof value.then === "function") {
            const flight = { child, claim, dropped: false };
            this.flights.add(flight);
            value.then((result) => this.settled(flight, true, result, traceparent), (err) => this.settled(flight, false, err, traceparent));
            return;
        }
        this.running--;
        this.processed(child, claim, value, traceparent);
    }
    settled(flight, ok, value, traceparent) {
        this.flights.delete(flight);
        if (flight.dropped)
            return; // released at the end of the grace period
        this.running--;
        if (ok)
            this.processed(flight.child, flight.claim, value, traceparent);
        else
            this.failed(flight.child, flight.claim, value, traceparent);
        if (this.stopping) {
            if (this.running === 0)
                this.wakeGrace?.();
        }
        else {
            this.pump();
        }
    }
    processed(child, claim, result, traceparent) {
        const item = { parent_id: child.parent_id, sequence: child.sequence, outcome: "processed", claim_id: claim.id };
        if (result !== undefined)
            item.result = result;
        if (traceparent)
            item.traceparent = traceparent;
        this.record(item, claim);
    }
    failed(child, claim, err, traceparent) {
        const item = { parent_id: child.parent_id, sequence: child.sequence, outcome: "failed", claim_id: claim.id };
        if (traceparent)
            item.traceparent = traceparent;
        if (err instanceof Failed) {
            item.reason = String(err.reason).slice(0, 1000);
            if (err.result !== undefined)
                item.result = err.result;
            return this.record(item, claim);
        }
        if (err instanceof Skipped) {
            item.outcome = "skipped";
            item.reason = String(err.reason).slice(0, 1000);
            return this.record(item, claim);
        }
        this.stats.errors++;
        const reason = reasonOf(err);
        const known = this.maxAttempts.get(child.parent_id);
        const decide = (max) => {
            if (max !== null && child.attempt >= max) {
                this.log.warn(`${child.parent_id}/${child.sequence}: attempt ${child.attempt} of ${max} failed (${reason}): recording failed`);
                item.reason = reason;
                this.record(item, claim);
            }
            else {
                this.log.warn(`${child.parent_id}/${child.sequence}: attempt ${child.attempt} failed (${reason}): releasing it for another attempt`);
                this.leases.release(child, claim);
            }
        };
        if (known === undefined || known instanceof Promise) {
            void this.maxAttemptsOf(child.parent_id).then(decide);
        }
        else {
            decide(known);
        }
    }
    /** The parent's max_attempts (read once per parent, cached; null: unlimited or unknown). */
    maxAttemptsOf(parentId) {
        const known = this.maxAttempts.get(parentId);
        if (known !== undefined)
            return Promise.resolve(known);
        const read = this.ledger.getParent(parentId).then((p) => p.max_attempts ?? null, (err) => {
            this.log.warn(`reading parent ${parentId}: ${err instanceof Error ? err.message : String(err)}`);
            return null;
        }).then((max) => {
            if (this.maxAttempts.size >= 10_000)
                this.maxAttempts.delete(this.maxAttempts.keys().next().value);
            this.maxAttempts.set(parentId, max);
            return max;
        });
        this.maxAttempts.set(parentId, read);
        return read;
    }
    /** One child fewer in hand (n fewer). */
    finish(claim, n = 1) {
        claim.remaining -= n;
        this.inHand -= n;
        if (claim.remaining <= 0)
            this.leases.active.delete(claim);
    }
    // ---- outcomes
    record(item, claim) {
        this.outbox.push(item);
        this.finish(claim);
    }
    /** POST /v1/outcomes for what the outbox could not send with a claim. */
    postOutcomes({ items, json }) {
        const post = this.retrying(() => postJson(this.ledger.transport, "/v1/outcomes", `{"outcomes":${json}}`, this.never.signal, 30_000))
            .then((answer) => this.countResults(items, answer.results), (err) => {
            this.stats.abandoned += items.length;
            this.log.warn(`${items.length} outcomes not recorded (the children come back when their lease runs out): `
                + `${err instanceof Error ? err.message : String(err)}`);
        });
        this.track(post);
        return post;
    }
    /** Retries what may get better (connections, 429, 5xx) a few times: outcome writes are safe to repeat. */
    async retrying(call, tries = 5) {
        for (let i = 0;; i++) {
            try {
                return await call();
            }
            catch (err) {
                const again = err instanceof UnavailableError || (err instanceof ProblemError && (err.status === 429 || err.status >= 500));
                if (!again || i + 1 >= tries)
                    throw err;
                await sleep((err instanceof ProblemError ? err.retryAfterMs : undefined) ?? backoffMs(i));
            }
        }
    }
    track(p) {
        this.posts.add(p);
        void p.finally(() => this.posts.delete(p));
    }
    countResults(items, results) {
        let other;
        const stats = this.stats;
        for (let i = 0; i < items.length; i++) {
            const status = results[i]?.status;
            if (status === "applied" || (status === "duplicate" && this.resent.has(items[i])))
                stats[items[i].outcome]++;
            else {
                stats.not_applied++;
                (other ??= {})[status ?? "missing"] = (other[status ?? "missing"] ?? 0) + 1;
            }
        }
        if (other)
            this.log.info(`outcomes not applied (the first terminal write won; not retried): ${JSON.stringify(other)}`);
    }
    // ---- leases and releases
    /** Gives back every child in hand that has not started. */
    releaseUnstarted() {
        for (const chunk of this.ready) {
            for (let i = chunk.next; i < chunk.children.length; i++)
                this.leases.release(chunk.children[i], chunk.claim);
            chunk.next = chunk.children.length;
        }
        this.ready = [];
        return this.leases.flush();
    }
    // ---- stopping
    async shutdown(graceMs) {
        if (this.stopping)
            return;
        this.stopping = true;
        clearTimeout(this.backoffTimer);
        this.backoffTimer = undefined;
        // A long poll is abandoned at once. A claim sent just now may be handing out
        // children: it gets up to half a second to answer (they are then released).
        const now = performance.now();
        for (const [abort, sentAt] of this.claimAborts) {
            const left = this.idle || graceMs === 0 ? 0 : sentAt + 500 - now;
            if (left <= 0)
                abort.abort();
            else
                setTimeout(() => abort.abort(), left).unref();
        }
        await this.releaseUnstarted();
        if (this.running > 0 && graceMs > 0) {
            await new Promise((resolve) => {
                const timer = setTimeout(resolve, graceMs);
                this.wakeGrace = () => { clearTimeout(timer); resolve(); };
                if (this.running === 0)
                    this.wakeGrace();
            });
            this.wakeGrace = undefined;
        }
        if (this.flights.size) {
            this.log.warn(`${this.flights.size} handlers still running after the grace period: releasing their children`);
            for (const flight of this.flights) {
                flight.dropped = true;
                this.running--;
                this.leases.release(flight.child, flight.claim);
            }
            this.flights.clear();
        }
        // Wait for claims still out (their children are released as they come back).
        while (this.claimsOut > 0)
            await sleep(20);
        await this.releaseUnstarted();
        await this.outbox.flush();
        while (this.posts.size)
            await Promise.allSettled([...this.posts]);
        this.leases.stop();
        this.outbox.close();
        if (this.handleSignals)
            for (const s of ["SIGTERM", "SIGINT"])
                process.off(s, this.onSignal);
        if (this.fatal !== undefined)
            this.rejectRun(this.fatal);
        else
            this.resolveRun(this.stats);
    }
}
