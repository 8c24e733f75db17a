/**
 * Errors: what the service answered (`ProblemError` and its subclasses, one
 * per kind of status), that it could not be reached (`UnavailableError`),
 * and what a handler throws to end a child (`Failed`, `Skipped`).
 */
import type { components } from "./schema.js";
/** An RFC 9457 problem document, as the service sends it. */
export type Problem = components["schemas"]["Problem"];
/** Base of every error this package throws. */
export declare class LedgerError extends Error {
    constructor(message: string, options?: {
        cause?: unknown;
    });
}
/** The service could not be reached (or kept answering 429/5xx) through every retry. */
export declare class UnavailableError extends LedgerError {
}
/** An error answer from the service (`application/problem+json`). */
export declare class ProblemError extends LedgerError {
    /** HTTP status. */
    readonly status: number;
    /** Problem type URI, e.g. `…/problems/outcome-conflict`. */
    readonly type: string;
    readonly title: string;
    readonly detail: string;
    /** The request field at fault, when the service names one. */
    readonly field: string | null;
    /** The whole problem document (extra members included). */
    readonly problem: Problem;
    /** The HTTP response (its body already read). */
    readonly response: Response | undefined;
    /** The answer's Retry-After, in milliseconds, when it had one. */
    retryAfterMs: number | undefined;
    constructor(status: number, problem: Partial<Problem> & Record<string, unknown>, response?: Response, what?: string);
}
/** 400, 413, 415, 422: the request is wrong. */
export declare class BadRequest extends ProblemError {
}
/** 401: no token, or one the service does not know. */
export declare class Unauthorized extends ProblemError {
}
/** 403: the token lacks the role or the queue. */
export declare class Forbidden extends ProblemError {
}
/** 404. */
export declare class NotFound extends ProblemError {
}
/** 409: it conflicts with the ledger's state. */
export declare class Conflict extends ProblemError {
}
/** 429 (retried first; surfaces when retries ran out). */
export declare class TooManyRequests extends ProblemError {
}
/** 5xx (503/502/504 retried first). */
export declare class ServiceUnavailable extends ProblemError {
}
/** The ProblemError subclass for a status. */
export declare function problemClass(status: number): typeof ProblemError;
declare const FAILED: unique symbol;
declare const SKIPPED: unique symbol;
/** Throw it in a handler: the child ends `failed` with this reason (and optional result). */
export declare class Failed extends Error {
    readonly reason: string;
    readonly result: unknown;
    readonly [FAILED] = true;
    constructor(reason: string, options?: {
        result?: unknown;
    });
    static [Symbol.hasInstance](value: unknown): boolean;
}
/** Throw it in a handler: the child ends `skipped` with this reason. */
export declare class Skipped extends Error {
    readonly reason: string;
    readonly [SKIPPED] = true;
    constructor(reason: string);
    static [Symbol.hasInstance](value: unknown): boolean;
}
export {};
