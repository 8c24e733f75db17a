/**
 * HTTP plumbing shared by the client and the worker: one request with
 * retries (refused or lost connections, timeouts, 429, 502, 503, 504;
 * exponential backoff with jitter, honouring Retry-After), problem answers
 * turned into ProblemError subclasses.
 */
import http from "node:http";
import https from "node:https";
import { Readable } from "node:stream";
import { LedgerError, ProblemError, UnavailableError, problemClass } from "./errors.js";

export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 502, 503, 504]);

export type Query = Record<string, string | number | boolean | null | undefined>;

export interface SendOptions {
  query?: Query;
  /** JSON-encoded unless `rawBody` is given. */
  body?: unknown;
  /** A body already serialised as JSON. */
  rawBody?: string | Uint8Array;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Retries after the first try (default: the client's). */
  retries?: number;
  /** Per try (default: the client's); 0 for none (streams). */
  timeoutMs?: number;
  accept?: string;
  /** The timeout covers only the wait for the answer's head, not reading its body. */
  stream?: boolean;
  /** Use node:http (when the client has no fetch of its own), whatever the body. */
  node?: boolean;
}

export interface Transport {
  base: string;
  headers: Record<string, string>;
  timeoutMs: number;
  retries: number;
  fetch: typeof fetch;
  /**
   * May use node:http (no fetch of the caller's own): for large byte bodies
   * (fetch copies them), streamed answers (backpressure) and the worker's
   * claims and outcomes (less overhead per request).
   */
  nodeHttp: boolean;
}

/** Bodies at least this large go through node:http when the transport allows it. */
const LARGE_BODY = 64 * 1024;
let agents: { http: http.Agent; https: https.Agent } | undefined;

/**
 * A fetch over node:http(s): byte bodies are written as they are (fetch
 * copies them), a streamed answer (`stream`) flows with the socket's
 * backpressure, and a request costs less than through fetch.
 */
function nodeFetch(url: string, init: {
  method: string; headers: Record<string, string>; body?: string | Uint8Array; signal?: AbortSignal; stream?: boolean;
}): Promise<Response> {
  // Idle sockets are dropped after 5 s, before the service closes them (10 s by default).
  agents ??= {
    http: new http.Agent({ keepAlive: true, timeout: 5000 }),
    https: new https.Agent({ keepAlive: true, timeout: 5000 }),
  };
  const u = new URL(url);
  const secure = u.protocol === "https:";
  return new Promise((resolve, reject) => {
    const { signal } = init;
    if (signal?.aborted) return reject(signal.reason);
    const length = init.body === undefined ? 0 : Buffer.byteLength(init.body);
    const req = (secure ? https : http).request(u, {
      method: init.method,
      headers: init.body === undefined ? init.headers : { ...init.headers, "content-length": String(length) },
      agent: secure ? agents!.https : agents!.http,
    }, (res) => {
      const status = res.statusCode ?? 502;
      const headers = new Headers();
      for (const [k, v] of Object.entries(res.headers)) {
        if (v !== undefined) headers.set(k, Array.isArray(v) ? v.join(", ") : v);
      }
      if (init.stream && status >= 200 && status < 300) {
        resolve(new Response(Readable.toWeb(res) as ReadableStream<Uint8Array>, { status, headers }));
        return;
      }
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", (err) => reject(new TypeError("fetch failed", { cause: err })));
      res.on("end", () => {
        signal?.removeEventListener("abort", onAbort);
        const body = status === 204 || status === 304 ? null : Buffer.concat(chunks);
        resolve(new Response(body, { status, headers }));
      });
    });
    const onAbort = () => req.destroy(signal!.reason as Error);
    signal?.addEventListener("abort", onAbort, { once: true });
    req.on("error", (err) => {
      signal?.removeEventListener("abort", onAbort);
      reject(signal?.aborted ? signal.reason : new TypeError("fetch failed", { cause: err }));
    });
    if (init.body === undefined) req.end();
    else req.end(init.body);
  });
}

/** Full jitter between half and all of an exponential step (base 250 ms, cap 10 s). */
export function backoffMs(attempt: number): number {
  const step = Math.min(10_000, 250 * 2 ** Math.min(attempt, 16));
  return step / 2 + Math.random() * (step / 2);
}

/** Retry-After in milliseconds (seconds or an HTTP date), or undefined. */
export function retryAfterMs(response: Response): number | undefined {
  const value = response.headers.get("retry-after");
  if (value === null || value.trim() === "") return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const date = Date.parse(value);
  return Number.isFinite(date) ? Math.max(0, date - Date.now()) : undefined;
}

/** A sleep that an AbortSignal cuts short (rejecting with its reason). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Both signals (AbortSignal.any where the runtime has it). */
export function anySignal(signals: (AbortSignal | undefined)[]): AbortSignal | undefined {
  const present = signals.filter((s): s is AbortSignal => s !== undefined);
  if (present.length <= 1) return present[0];
  if (typeof AbortSignal.any === "function") return AbortSignal.any(present);
  const controller = new AbortController();
  for (const s of present) {
    if (s.aborted) {
      controller.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => controller.abort(s.reason), { once: true });
  }
  return controller.signal;
}

export function buildUrl(base: string, path: string, query?: Query): string {
  let url = base + path;
  if (query) {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) params.set(k, String(v));
    const s = params.toString();
    if (s) url += `?${s}`;
  }
  return url;
}

/** A ProblemError from a non-2xx response (its body read here). */
export async function problemFrom(response: Response, what: string): Promise<ProblemError> {
  let text = "";
  try {
    text = await response.text();
  } catch {
    /* the body was lost: the status still says enough */
  }
  let problem: Record<string, unknown>;
  try {
    const parsed: unknown = JSON.parse(text);
    problem = parsed && typeof parsed === "object" ? (parsed as Record<string, unknown>) : { detail: text };
  } catch {
    problem = { detail: text.slice(0, 500) };
  }
  const Class = problemClass(response.status);
  const error = new Class(response.status, problem, response, what);
  error.retryAfterMs = retryAfterMs(response);
  return error;
}

/** Whether an error from fetch is the connection's (retryable), not ours. */
export function isConnectionError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  if (err.name === "TimeoutError") return true;
  return err instanceof TypeError && "cause" in err && err.cause !== undefined;
}

export function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    return cause?.code ?? cause?.message ?? err.message;
  }
  return String(err);
}

/**
 * Sends one request, retrying what may get better. Resolves with a 2xx
 * Response (body unread); rejects with a ProblemError (an error answer, or a
 * retryable one when retries ran out), an UnavailableError (no answer through
 * every retry) or the caller's abort reason.
 */
export async function send(t: Transport, method: string, path: string, o: SendOptions = {}): Promise<Response> {
  const url = buildUrl(t.base, path, o.query);
  const what = `${method} ${path}`;
  const headers: Record<string, string> = { ...t.headers, accept: o.accept ?? "application/json", ...o.headers };
  let body: string | Uint8Array | undefined = o.rawBody;
  if (body === undefined && o.body !== undefined) body = JSON.stringify(o.body);
  if (body !== undefined) headers["content-type"] = "application/json";
  const retries = o.retries ?? t.retries;
  const timeoutMs = o.timeoutMs ?? t.timeoutMs;
  for (let attempt = 0; ; attempt++) {
    let wait = backoffMs(attempt);
    let last: unknown;
    try {
      let response: Response;
      if (o.stream) {
        const head = new AbortController();
        const timer = timeoutMs > 0 ? setTimeout(() => head.abort(new DOMException("timed out", "TimeoutError")), timeoutMs) : undefined;
        try {
          const signal = anySignal([o.signal, head.signal]);
          response = t.nodeHttp
            ? await nodeFetch(url, { method, headers, body, signal, stream: true })
            : await t.fetch(url, { method, headers, body, signal });
        } finally {
          clearTimeout(timer);
        }
      } else {
        const signal = anySignal([o.signal, timeoutMs > 0 ? AbortSignal.timeout(timeoutMs) : undefined]);
        response = t.nodeHttp && (o.node || (body instanceof Uint8Array && body.byteLength >= LARGE_BODY))
          ? await nodeFetch(url, { method, headers, body, signal })
          : await t.fetch(url, { method, headers, body, signal });
      }
      if (response.ok) return response;
      const error = await problemFrom(response, what);
      if (!RETRY_STATUSES.has(response.status) || attempt >= retries) throw error;
      if (error.retryAfterMs !== undefined) wait = error.retryAfterMs;
      last = error;
    } catch (err) {
      if (err instanceof ProblemError) throw err;
      if (o.signal?.aborted) throw o.signal.reason;
      if (!isConnectionError(err)) {
        if (err instanceof LedgerError) throw err;
        throw new LedgerError(`${what}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
      }
      if (attempt >= retries) {
        throw new UnavailableError(`${what}: the service at ${t.base} could not be reached after ${attempt + 1} tries `
          + `(${describe(err)}); is it running, and is the URL right (url option or LEDGER_URL)?`, { cause: err });
      }
      last = err;
    }
    void last;
    await sleep(wait, o.signal);
  }
}

/**
 * One POST of a JSON body answered with JSON, no retries: the worker's hot
 * path (claims, outcomes). Over node:http with no Response object on success;
 * through `send` when the client has a fetch of its own. Rejects as `send`
 * does (ProblemError, UnavailableError, the signal's reason).
 */
export function postJson<T>(t: Transport, path: string, body: string, signal: AbortSignal, timeoutMs: number): Promise<T> {
  const what = `POST ${path}`;
  if (!t.nodeHttp) {
    return send(t, "POST", path, { rawBody: body, signal, retries: 0, timeoutMs }).then((r) => jsonOf<T>(r, what));
  }
  agents ??= {
    http: new http.Agent({ keepAlive: true, timeout: 5000 }),
    https: new https.Agent({ keepAlive: true, timeout: 5000 }),
  };
  const url = new URL(t.base + path);
  const secure = url.protocol === "https:";
  return new Promise<T>((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const headers = {
      ...t.headers, accept: "application/json", "content-type": "application/json", "content-length": String(Buffer.byteLength(body)),
    };
    const req = (secure ? https : http).request(url, { method: "POST", headers, agent: secure ? agents!.https : agents!.http }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => { text += chunk; });
      res.on("error", (err) => fail(err));
      res.on("end", () => {
        signal.removeEventListener("abort", onAbort);
        const status = res.statusCode ?? 502;
        if (status >= 200 && status < 300) {
          try {
            resolve(JSON.parse(text) as T);
          } catch {
            reject(new LedgerError(`${what}: the answer is not JSON (is the URL the ledger?): ${text.slice(0, 200)}`));
          }
          return;
        }
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (typeof v === "string") h.set(k, v);
        problemFrom(new Response(text, { status, headers: h }), what).then(reject, reject);
      });
    });
    const fail = (err: unknown) => {
      signal.removeEventListener("abort", onAbort);
      if (signal.aborted) return reject(signal.reason);
      const cause = err as Error;
      reject(new UnavailableError(`${what}: ${describe(new TypeError("fetch failed", { cause }))}`, { cause }));
    };
    const onAbort = () => req.destroy(signal.reason as Error);
    signal.addEventListener("abort", onAbort, { once: true });
    req.setTimeout(timeoutMs, () => req.destroy(Object.assign(new Error(`no answer in ${timeoutMs} ms`), { code: "TimeoutError" })));
    req.on("error", fail);
    req.end(body);
  });
}

/** A 2xx answer's JSON (undefined for an empty body). */
export async function jsonOf<T>(response: Response, what: string): Promise<T> {
  const text = await response.text();
  if (text === "") return undefined as T;
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new LedgerError(`${what}: the answer is not JSON (is the URL the ledger?): ${text.slice(0, 200)}`);
  }
}
