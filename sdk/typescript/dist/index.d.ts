/**
 * child-ledger: the client (producer side), the worker and their errors.
 *
 *     import { Ledger, Worker, Failed } from "child-ledger";
 */
export { Ledger } from "./client.js";
export type { LedgerOptions, Parent, ParentList, Counts, Verdict, ChildSpec, AppendChild, Appended, RegisterParent, ClaimChildren, Claim, ClaimedChild, BatchOutcome, BatchResult, BatchResults, RecordOutcome, OutcomeRecorded, Extended, Released, ReleaseChild, ResultRow, ChildState, Summary, Cancelled, Retried, ChildRetried, Redriven, ReconcileReport, Queue, QueuePause, QueueLimits, KeyLimits, SetQueueLimits, SetLimits, Child as ChildRow, ChildList, ListParentsQuery, } from "./client.js";
export type { ChildInput, RegisterSettings } from "./producer.js";
export { PAGE_CHILDREN, PAGE_BYTES } from "./producer.js";
export type { LedgerEvent, WatchOptions } from "./events.js";
export { parseSse } from "./events.js";
export { Worker, stderrLogger } from "./worker.js";
export type { Child, Handler, Validator, Logger, WorkerOptions, WorkerStats } from "./worker.js";
export { LedgerError, UnavailableError, ProblemError, BadRequest, Unauthorized, Forbidden, NotFound, Conflict, TooManyRequests, ServiceUnavailable, Failed, Skipped, } from "./errors.js";
export type { Problem } from "./errors.js";
export type { components, operations, paths } from "./schema.js";
