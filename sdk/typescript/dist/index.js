/**
 * child-ledger: the client (producer side), the worker and their errors.
 *
 *     import { Ledger, Worker, Failed } from "child-ledger";
 */
export { Ledger } from "./client.js";
export { PAGE_CHILDREN, PAGE_BYTES } from "./producer.js";
export { parseSse } from "./events.js";
export { Worker, stderrLogger } from "./worker.js";
export { LedgerError, UnavailableError, ProblemError, BadRequest, Unauthorized, Forbidden, NotFound, Conflict, TooManyRequests, ServiceUnavailable, Failed, Skipped, } from "./errors.js";
