import { ProblemError } from "./errors.js";
export declare const RETRY_STATUSES: ReadonlySet<number>;
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
/** Full jitter between half and all of an exponential step (base 250 ms, cap 10 s). */
export declare function backoffMs(attempt: number): number;
/** Retry-After in milliseconds (seconds or an HTTP date), or undefined. */
export declare function retryAfterMs(response: Response): number | undefined;
/** A sleep that an AbortSignal cuts short (rejecting with its reason). */
export declare function sleep(ms: number, signal?: AbortSignal): Promise<void>;
/** Both signals (AbortSignal.any where the runtime has it). */
export declare function anySignal(signals: (AbortSignal | undefined)[]): AbortSignal | undefined;
export declare function buildUrl(base: string, path: string, query?: Query): string;
/** A ProblemError from a non-2xx response (its body read here). */
export declare function problemFrom(response: Response, what: string): Promise<ProblemError>;
/** Whether an error from fetch is the connection's (retryable), not ours. */
export declare function isConnectionError(err: unknown): boolean;
export declare function describe(err: unknown): string;
/**
 * Sends one request, retrying what may get better. Resolves with a 2xx
 * Response (body unread); rejects with a ProblemError (an error answer, or a
 * retryable one when retries ran out), an UnavailableError (no answer through
 * every retry) or the caller's abort reason.
 */
export declare function send(t: Transport, method: string, path: string, o?: SendOptions): Promise<Response>;
/**
 * One POST of a JSON body answered with JSON, no retries: the worker's hot
 * path (claims, outcomes). Over node:http with no Response object on success;
 * through `send` when the client has a fetch of its own. Rejects as `send`
 * does (ProblemError, UnavailableError, the signal's reason).
 */
export declare function postJson<T>(t: Transport, path: string, body: string, signal: AbortSignal, timeoutMs: number): Promise<T>;
/** A 2xx answer's JSON (undefined for an empty body). */
export declare function jsonOf<T>(response: Response, what: string): Promise<T>;
