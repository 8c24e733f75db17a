/**
 * The client: `new Ledger(url, {token})`, one typed method per operation of
 * the contract, plus `register`, `watch`, `wait` and `results`.
 */
import type { components, operations } from "./schema.js";
import { LedgerError } from "./errors.js";
import { jsonOf, send, type Query, type SendOptions, type Transport } from "./http.js";
import { register, type ChildInput, type RegisterSettings } from "./producer.js";
import { results, wait, watchStream, type LedgerEvent, type WatchOptions } from "./events.js";

type S = components["schemas"];
type Json<R> = R extends { content: { "application/json": infer B } } ? B : never;
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

const enc = encodeURIComponent;

export class Ledger {
  /** The service's base URL, without a trailing slash. */
  readonly url: string;
  /** @internal */
  readonly transport: Transport;

  constructor(url?: string, options: LedgerOptions = {}) {
    this.url = (url ?? process.env.LEDGER_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
    const token = options.token ?? process.env.LEDGER_TOKEN;
    const headers: Record<string, string> = {};
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
  async request<T = unknown>(method: string, path: string, options: SendOptions = {}): Promise<T> {
    const response = await send(this.transport, method, path, options);
    return jsonOf<T>(response, `${method} ${path}`);
  }

  private get<T>(path: string, query?: Query): Promise<T> {
    return this.request<T>("GET", path, { query });
  }

  private post<T>(path: string, body: unknown = {}, options: SendOptions = {}): Promise<T> {
    return this.request<T>("POST", path, { ...options, body });
  }

  // ---- producer side

  /**
   * Registers a parent with its children (an array, iterable, generator or
   * async iterable of child specs): one PUT when they fit one page, else
   * PUT + appended pages + seal. Safe to repeat.
   */
  register(parentId: string, queue: string, children: ChildInput, settings: RegisterSettings = {}): Promise<Parent> {
    return register(this, parentId, queue, children, settings);
  }

  /** Appends children (explicit sequences) to a decomposing parent. */
  append(parentId: string, children: AppendChild[]): Promise<Appended> {
    return this.post(`/v1/parents/${enc(parentId)}/children`, { children });
  }

  /** Marks a decomposing parent decomposed once sequences 0..total-1 exist. */
  seal(parentId: string, total: number): Promise<Parent> {
    return this.post(`/v1/parents/${enc(parentId)}/seal`, { total });
  }

  getParent(parentId: string, options: { include?: "payload" } = {}): Promise<Parent> {
    return this.get(`/v1/parents/${enc(parentId)}`, { include: options.include });
  }

  listParents(query: ListParentsQuery = {}): Promise<ParentList> {
    return this.get("/v1/parents", query as Query);
  }

  /** One page of a parent's children in sequence order (`after`: the last sequence of the previous page). */
  listChildren(parentId: string, query: { state?: ChildState; after?: number; limit?: number } = {}): Promise<ChildList> {
    return this.get(`/v1/parents/${enc(parentId)}/children`, query);
  }

  /** One child row: state, lease, outcome, conflicts. */
  getChild(parentId: string, sequence: number): Promise<Child> {
    return this.get(`/v1/parents/${enc(parentId)}/children/${sequence}`);
  }

  /** Counts by state and the most frequent failure and skip reasons. */
  summary(parentId: string): Promise<Summary> {
    return this.get(`/v1/parents/${enc(parentId)}/summary`);
  }

  /** Cancels a parent: every open child becomes skipped with this reason. */
  cancel(parentId: string, reason: string): Promise<Cancelled> {
    return this.post(`/v1/parents/${enc(parentId)}/cancel`, { reason });
  }

  /** Retries one child (`sequence`) or every child in `states`. */
  retry(parentId: string, options: { sequence: number } | { states: ChildState[] }): Promise<Retried | ChildRetried> {
    if ("sequence" in options) return this.post(`/v1/parents/${enc(parentId)}/children/${options.sequence}/retry`, {});
    return this.post(`/v1/parents/${enc(parentId)}/retry`, { states: options.states });
  }

  /** Registers a new parent `into` from this one's selected children. */
  redrive(parentId: string, options: {
    into: string; states?: ChildState[]; reasons?: string[]; dryRun?: boolean; queue?: string; priority?: number;
  }): Promise<Redriven> {
    const { dryRun, ...rest } = options;
    return this.post(`/v1/parents/${enc(parentId)}/redrive`, { ...rest, ...(dryRun === undefined ? {} : { dry_run: dryRun }) });
  }

  /** Compares (and with `dryRun: false` repairs) a parent's stored projection. Default: a dry run. */
  reconcile(parentId: string, options: { dryRun?: boolean } = {}): Promise<ReconcileReport> {
    return this.post(`/v1/parents/${enc(parentId)}/reconcile`,
      options.dryRun === undefined ? {} : { dry_run: options.dryRun });
  }

  pause(queue: string): Promise<QueuePause> {
    return this.post(`/v1/queues/${enc(queue)}/pause`, {});
  }

  resume(queue: string): Promise<QueuePause> {
    return this.post(`/v1/queues/${enc(queue)}/resume`, {});
  }

  getQueue(queue: string): Promise<Queue> {
    return this.get(`/v1/queues/${enc(queue)}`);
  }

  /** A queue's limits, or one flow key's (`key`). */
  limits(queue: string, options: { key?: string } = {}): Promise<QueueLimits | KeyLimits> {
    return this.get(options.key === undefined
      ? `/v1/queues/${enc(queue)}/limits`
      : `/v1/queues/${enc(queue)}/keys/${enc(options.key)}/limits`);
  }

  /** Sets a queue's limits, or one flow key's (`key`). */
  setLimits(queue: string, limits: SetQueueLimits | SetLimits, options: { key?: string } = {}): Promise<QueueLimits | KeyLimits> {
    const path = options.key === undefined
      ? `/v1/queues/${enc(queue)}/limits`
      : `/v1/queues/${enc(queue)}/keys/${enc(options.key)}/limits`;
    return this.request("PUT", path, { body: limits });
  }

  // ---- low-level worker calls

  claim(queue: string, body: ClaimChildren = {}, options: SendOptions = {}): Promise<Claim> {
    return this.post(`/v1/queues/${enc(queue)}/claims`, body, options);
  }

  extend(claimId: string, leaseSeconds?: number): Promise<Extended> {
    return this.post(`/v1/claims/${enc(claimId)}/extend`, leaseSeconds === undefined ? {} : { lease_seconds: leaseSeconds });
  }

  /** Gives children back (all the claim holds when `children` is omitted). */
  release(claimId: string, children?: ReleaseChild[], options: { delaySeconds?: number } = {}): Promise<Released> {
    const body: S["ReleaseClaim"] = {};
    if (children) body.children = children;
    if (options.delaySeconds !== undefined) body.delay_seconds = options.delaySeconds;
    return this.post(`/v1/claims/${enc(claimId)}/release`, body);
  }

  /** Records up to 1000 outcomes; one result per item, in order. */
  recordOutcomes(outcomes: BatchOutcome[], options: { traceparent?: string } = {}): Promise<BatchResults> {
    return this.post("/v1/outcomes", { outcomes },
      options.traceparent ? { headers: { traceparent: options.traceparent } } : {});
  }

  recordOutcome(parentId: string, sequence: number, outcome: RecordOutcome): Promise<OutcomeRecorded> {
    return this.post(`/v1/parents/${enc(parentId)}/children/${sequence}/outcome`, outcome);
  }

  // ---- following a parent

  /** A parent's events until (and including) its `completed`, reconnecting as needed. */
  watch(parentId: string, options: WatchOptions = {}): AsyncIterable<LedgerEvent> {
    return watchStream(this, `/v1/parents/${enc(parentId)}/events`, true, options);
  }

  /** A queue's events; never ends by itself (abort with `signal`). */
  watchQueue(queue: string, options: WatchOptions = {}): AsyncIterable<LedgerEvent> {
    return watchStream(this, `/v1/queues/${enc(queue)}/events`, false, options);
  }

  /** Resolves with the parent once complete (with its `verdict`). */
  wait(parentId: string, options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<Parent> {
    return wait(this, parentId, options);
  }

  /** Each child's outcome row, streamed (NDJSON) in sequence order. */
  results(parentId: string, options: { state?: ChildState; signal?: AbortSignal } = {}): AsyncIterable<ResultRow> {
    return results(this, parentId, options);
  }
}
