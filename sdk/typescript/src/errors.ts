/**
 * Errors: what the service answered (`ProblemError` and its subclasses, one
 * per kind of status), that it could not be reached (`UnavailableError`),
 * and what a handler throws to end a child (`Failed`, `Skipped`).
 */
import type { components } from "./schema.js";

/** An RFC 9457 problem document, as the service sends it. */
export type Problem = components["schemas"]["Problem"];

/** Base of every error this package throws. */
export class LedgerError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The service could not be reached (or kept answering 429/5xx) through every retry. */
export class UnavailableError extends LedgerError {}

/** What to do about a status, appended to the problem's own text. */
function hint(status: number): string {
  switch (status) {
    case 400:
    case 413:
    case 415:
    case 422:
      return "fix the request (the field named above)";
    case 401:
      return "give a token the service knows (token option or LEDGER_TOKEN)";
    case 403:
      return "the token lacks the role or queue this call needs";
    case 404:
      return "check the id or queue name";
    case 409:
      return "it conflicts with what the ledger already holds";
    case 429:
      return "slow down; retry after the time the service named";
    default:
      return status >= 500 ? "the service is unavailable; retry later" : "";
  }
}

/** An error answer from the service (`application/problem+json`). */
export class ProblemError extends LedgerError {
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

  constructor(status: number, problem: Partial<Problem> & Record<string, unknown>, response?: Response, what?: string) {
    const type = typeof problem.type === "string" ? problem.type : "about:blank";
    const title = typeof problem.title === "string" ? problem.title : `HTTP ${status}`;
    const detail = typeof problem.detail === "string" ? problem.detail : "";
    const field = typeof problem.field === "string" ? problem.field : null;
    const todo = hint(status);
    super(
      `${what ? `${what}: ` : ""}${status} ${title}${detail ? `: ${detail}` : ""}`
        + `${field ? ` (field: ${field})` : ""}${todo ? ` — ${todo}` : ""} [${type}]`,
    );
    this.status = status;
    this.type = type;
    this.title = title;
    this.detail = detail;
    this.field = field;
    this.problem = { ...problem, type, title, detail, status } as Problem;
    this.response = response;
    this.retryAfterMs = undefined;
  }
}

/** 400, 413, 415, 422: the request is wrong. */
export class BadRequest extends ProblemError {}
/** 401: no token, or one the service does not know. */
export class Unauthorized extends ProblemError {}
/** 403: the token lacks the role or the queue. */
export class Forbidden extends ProblemError {}
/** 404. */
export class NotFound extends ProblemError {}
/** 409: it conflicts with the ledger's state. */
export class Conflict extends ProblemError {}
/** 429 (retried first; surfaces when retries ran out). */
export class TooManyRequests extends ProblemError {}
/** 5xx (503/502/504 retried first). */
export class ServiceUnavailable extends ProblemError {}

/** The ProblemError subclass for a status. */
export function problemClass(status: number): typeof ProblemError {
  if (status === 400 || status === 413 || status === 415 || status === 422) return BadRequest;
  if (status === 401) return Unauthorized;
  if (status === 403) return Forbidden;
  if (status === 404) return NotFound;
  if (status === 409) return Conflict;
  if (status === 429) return TooManyRequests;
  if (status >= 500) return ServiceUnavailable;
  return ProblemError;
}

const FAILED = Symbol.for("child-ledger.Failed");
const SKIPPED = Symbol.for("child-ledger.Skipped");

/** Throw it in a handler: the child ends `failed` with this reason (and optional result). */
export class Failed extends Error {
  readonly reason: string;
  readonly result: unknown;
  readonly [FAILED] = true;
  constructor(reason: string, options: { result?: unknown } = {}) {
    super(reason);
    this.name = "Failed";
    this.reason = reason;
    this.result = options.result;
  }
  static [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[FAILED] === true;
  }
}

/** Throw it in a handler: the child ends `skipped` with this reason. */
export class Skipped extends Error {
  readonly reason: string;
  readonly [SKIPPED] = true;
  constructor(reason: string) {
    super(reason);
    this.name = "Skipped";
    this.reason = reason;
  }
  static [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[SKIPPED] === true;
  }
}
