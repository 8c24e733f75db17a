import { LedgerError } from "./errors.js";
import { jsonOf, send } from "./http.js";
import { register } from "./producer.js";
import { results, wait, watchStream } from "./events.js";
const enc = encodeURIComponent;
export class Ledger {
    /** The service's base URL, without a trailing slash. */
    url;
    /** @internal */
    transport;
    constructor(url, options = {}) {
        this.url = (url ?? process.env.LEDGER_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
        const token = options.token ?? process.env.LEDGER_TOKEN;
        const headers = {};
        if (token) {
            if (!/^[\x21-\x7e]+$/.test(token)) {
                throw new LedgerError("the token holds characters an HTTP header cannot carry (only visible ASCII)");
            }
            headers.authorization = `Bearer ${token}`;
        }
        this.transport = {
            base: this.url,
            headers,
            timeoutMs: options.timeoutMs ?? 30_000,
            retries: options.retries ?? 4,
            fetch: options.fetch ?? globalThis.fetch.bind(globalThis),
            nodeHttp: options.fetch === undefined,
        };
    }
    /** Sends a request and resolves with its JSON answer (retrying what may get better). */
    async request(method, path, options = {}) {
        const response = await send(this.transport, method, path, options);
        return jsonOf(response, `${method} ${path}`);
    }
    get(path, query) {
        return this.request("GET", path, { query });
    }
    post(path, body = {}, options = {}) {
        return this.request("POST", path, { ...options, body });
    }
    // ---- producer side
    /**
     * Registers a parent with its children (an array, iterable, generator or
     * async iterable of child specs): one PUT when they fit one page, else
     * PUT + appended pages + seal. Safe to repeat.
     */
    register(parentId, queue, children, settings = {}) {
        return register(this, parentId, queue, children, settings);
    }
    /** Appends children (explicit sequences) to a decomposing parent. */
    append(parentId, children) {
        return this.post(`/v1/parents/${enc(parentId)}/children`, { children });
    }
    /** Marks a decomposing parent decomposed once sequences 0..total-1 exist. */
    seal(parentId, total) {
        return this.post(`/v1/parents/${enc(parentId)}/seal`, { total });
    }
    getParent(parentId, options = {}) {
        return this.get(`/v1/parents/${enc(parentId)}`, { include: options.include });
    }
    listParents(query = {}) {
        return this.get("/v1/parents", query);
    }
    /** One page of a parent's children in sequence order (`after`: the last sequence of the previous page). */
    listChildren(parentId, query = {}) {
        return this.get(`/v1/parents/${enc(parentId)}/children`, query);
    }
    /** One child row: state, lease, outcome, conflicts. */
    getChild(parentId, sequence) {
        return this.get(`/v1/parents/${enc(parentId)}/children/${sequence}`);
    }
    /** Counts by state and the most frequent failure and skip reasons. */
    summary(parentId) {
        return this.get(`/v1/parents/${enc(parentId)}/summary`);
    }
    /** Cancels a parent: every open child becomes skipped with this reason. */
    cancel(parentId, reason) {
        return this.post(`/v1/parents/${enc(parentId)}/cancel`, { reason });
    }
    /** Retries one child (`sequence`) or every child in `states`. */
    retry(parentId, options) {
        if ("sequence" in options)
            return this.post(`/v1/parents/${enc(parentId)}/children/${options.sequence}/retry`, {});
        return this.post(`/v1/parents/${enc(parentId)}/retry`, { states: options.states });
    }
    /** Registers a new parent `into` from this one's selected children. */
    redrive(parentId, options) {
        const { dryRun, ...rest } = options;
        return this.post(`/v1/parents/${enc(parentId)}/redrive`, { ...rest, ...(dryRun === undefined ? {} : { dry_run: dryRun }) });
    }
    /** Compares (and with `dryRun: false` repairs) a parent's stored projection. Default: a dry run. */
    reconcile(parentId, options = {}) {
        return this.post(`/v1/parents/${enc(parentId)}/reconcile`, options.dryRun === undefined ? {} : { dry_run: options.dryRun });
    }
    pause(queue) {
        return this.post(`/v1/queues/${enc(queue)}/pause`, {});
    }
    resume(queue) {
        return this.post(`/v1/queues/${enc(queue)}/resume`, {});
    }
    getQueue(queue) {
        return this.get(`/v1/queues/${enc(queue)}`);
    }
    /** A queue's limits, or one flow key's (`key`). */
    limits(queue, options = {}) {
        return this.get(options.key === undefined
            ? `/v1/queues/${enc(queue)}/limits`
            : `/v1/queues/${enc(queue)}/keys/${enc(options.key)}/limits`);
    }
    /** Sets a queue's limits, or one flow key's (`key`). */
    setLimits(queue, limits, options = {}) {
        const path = options.key === undefined
            ? `/v1/queues/${enc(queue)}/limits`
            : `/v1/queues/${enc(queue)}/keys/${enc(options.key)}/limits`;
        return this.request("PUT", path, { body: limits });
    }
    // ---- low-level worker calls
    claim(queue, body = {}, options = {}) {
        return this.post(`/v1/queues/${enc(queue)}/claims`, body, options);
    }
    extend(claimId, leaseSeconds) {
        return this.post(`/v1/claims/${enc(claimId)}/extend`, leaseSeconds === undefined ? {} : { lease_seconds: leaseSeconds });
    }
    /** Gives children back (all the claim holds when `children` is omitted). */
    release(claimId, children, options = {}) {
        const body = {};
        if (children)
            body.children = children;
        if (options.delaySeconds !== undefined)
            body.delay_seconds = options.delaySeconds;
        return this.post(`/v1/claims/${enc(claimId)}/release`, body);
    }
    /** Records up to 1000 outcomes; one result per item, in order. */
    recordOutcomes(outcomes, options = {}) {
        return this.post("/v1/outcomes", { outcomes }, options.traceparent ? { headers: { traceparent: options.traceparent } } : {});
    }
    recordOutcome(parentId, sequence, outcome) {
        return this.post(`/v1/parents/${enc(parentId)}/children/${sequence}/outcome`, outcome);
    }
    // ---- following a parent
    /** A parent's events until (and including) its `completed`, reconnecting as needed. */
    watch(parentId, options = {}) {
        return watchStream(this, `/v1/parents/${enc(parentId)}/events`, true, options);
    }
    /** A queue's events; never ends by itself (abort with `signal`). */
    watchQueue(queue, options = {}) {
        return watchStream(this, `/v1/queues/${enc(queue)}/events`, false, options);
    }
    /** Resolves with the parent once complete (with its `verdict`). */
    wait(parentId, options = {}) {
        return wait(this, parentId, options);
    }
    /** Each child's outcome row, streamed (NDJSON) in sequence order. */
    results(parentId, options = {}) {
        return results(this, parentId, options);
    }
}
