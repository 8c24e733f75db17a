#!/usr/bin/env node
// An example child-ledger worker: Node 20+, built-in fetch, no dependencies.
//
//     node worker.mjs --queue events [--url http://127.0.0.1:8080] [--token T] [--exit-when-empty]
//
// With access control on, give a token with the `worker` role (--token, or
// LEDGER_TOKEN in the environment): it is sent as `Authorization: Bearer`.
//
// The loop, for anyone writing a worker in another language (the contract is
// the OpenAPI document, openapi/openapi.json in the repository and GET
// /openapi.json on the service):
//
// 1. Claim a leased chunk: POST /v1/queues/{queue}/claims
//        {"limit": 50, "lease_seconds": 30, "worker": "node-123", "wait_seconds": 5}
//    -> {"claim_id": "<uuid>", "lease_expires_at": "...", "children": [{"parent_id",
//        "sequence", "key", "payload", "attempt", "idempotency_key", "previous_attempt",
//        "traceparent"}]}
//    An empty "children" list means nothing was claimable (after long-polling up
//    to wait_seconds, 0-20).
// 2. Keep the lease while working: a background timer calls
//    POST /v1/claims/{claim_id}/extend {"lease_seconds": 30} whenever about a third
//    of the lease remains. {"extended": 0} means the claim holds nothing any more
//    (the lease ran out and the children went back to the queue): stop starting
//    them, as when by our own clock the lease may have run out (extends failing).
//    Children never started are released (step 5) whatever ended the chunk.
// 3. Work each child. If "previous_attempt" is "expired", an earlier holder may
//    already have had the remote effect: look the child's "idempotency_key" up on
//    the remote side first and, if it is there, record the outcome without redoing it.
// 4. Record outcomes in batches: POST /v1/outcomes {"outcomes": [{"parent_id",
//    "sequence", "outcome": "processed"|"failed", "reason", "result", "claim_id"}]}
//    -> {"results": [{"parent_id", "sequence", "status"}]}, in request order.
//    "applied" means this write made the child terminal. Anything else ("duplicate":
//    the same outcome was already recorded, "conflict": a different one won,
//    "not_found", "not_decomposed") is logged and never retried: the first terminal
//    write wins. ("duplicate" is also what a retried post gets for its own
//    earlier write, so "not_applied" in the summary counts those too.) Outcomes
//    are not fenced by the lease: a late write still counts if it is the first.
//    Trace context: a child's "traceparent" (W3C, or null) is logged and sent as
//    the `traceparent` header of the outcome post that reports it, so the outcome
//    joins the producer's trace; a batch holds children of one traceparent only
//    (with the service exporting traces, each claimed child has its own, and its
//    outcome goes alone).
//    A chunk's last batch goes with the next claim instead, as its "outcomes"
//    member: one request records them and claims the next chunk, and its answer's
//    "outcome_results" is what POST /v1/outcomes would have answered. (Not when
//    the batch carries a traceparent, which is a header of its own request, nor
//    when stopping: then it is posted at once.)
// 5. On SIGTERM/SIGINT: stop claiming, finish the child in hand, post the outcomes
//    already computed, give the rest back with POST /v1/claims/{claim_id}/release
//    {"children": [{"parent_id", "sequence"}]} (fenced by claim_id: only children
//    this claim still holds move) and exit 0.
// 6. What can get better is retried with exponential backoff, honouring
//    Retry-After: a refused or lost connection, a timeout, 429, 502, 503 and 504.
//    Outcome, extend and release calls are safe to repeat. A claim whose answer
//    was lost leaves its children leased to nobody until the lease runs out; they
//    then come back with previous_attempt "expired" (step 3).
//    What cannot get better stops the worker at once with a clear message and
//    exit status 2: any other answer to a claim (401 a token the service does
//    not know, 403, 404, 422 a flag out of range: application/problem+json, whose
//    "type" and "detail" are logged), a token that cannot go in a header, an
//    answer that is not JSON. Such an answer to an extend, an outcome batch or
//    a release is logged; those children come back when the lease runs out.
// 7. --exit-when-empty: exit once a claim comes back empty and nothing this
//    worker claimed is still in flight (children whose outcome it could not
//    record stay leased to it until their lease runs out; it claims on until
//    then). Other workers' leases are theirs: it does not wait for them.
//
// stderr gets one log line per chunk (and one per child that carries a traceparent); stdout gets one JSON line at exit:
// {"worker", "lang", "claimed", "processed", "failed", "deduplicated", "not_applied",
//  "released", "abandoned"}, where claimed = processed + failed + not_applied +
// released + abandoned ("deduplicated" is part of "processed"; "abandoned" children
// come back to some worker when their lease runs out).
// The lease timer only fires while the work awaits: keep CPU-bound work in
// short slices (or a worker thread) so the event loop can extend the lease.

import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { parseArgs } from "node:util";

const LANG = "node";
const RETRY_STATUSES = new Set([429, 502, 503, 504]);

const log = (message) => process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${message}\n`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Stopping (SIGTERM/SIGINT) wakes anything parked in nap().
let stopping = false;
const wakers = new Set();
function nap(ms) {
  return new Promise((resolve) => {
    const wake = () => { clearTimeout(timer); wakers.delete(wake); resolve(); };
    const timer = setTimeout(wake, ms);
    wakers.add(wake);
  });
}

/** An error answer that retrying will not fix (an RFC 9457 problem document). */
class Problem extends Error {
  constructor(status, body) {
    super(`HTTP ${status} ${body.type ?? "?"}: ${body.detail ?? JSON.stringify(body)}`);
    this.status = status;
    this.body = body;
  }
}
/** The service stayed unreachable (or kept answering 503) through every retry. */
class Unavailable extends Error {}
/** Something retrying will not fix that is not a problem answer: stop with this message. */
class Fatal extends Error {}

let opts;
try {
  ({ values: opts } = parseArgs({
    options: {
      url: { type: "string", default: "http://127.0.0.1:8080" },
      queue: { type: "string" },
      token: { type: "string", default: process.env.LEDGER_TOKEN },
      worker: { type: "string", default: `${LANG}-${process.pid}` },
      "exit-when-empty": { type: "boolean", default: false },
      limit: { type: "string", default: "50" },
      "lease-seconds": { type: "string", default: "30" },
      "wait-seconds": { type: "string" }, // default 5; 1 with --exit-when-empty
      "batch-size": { type: "string", default: "25" },
      "work-ms": { type: "string", default: "0" },
      "effects-file": { type: "string" },
    },
  }));
} catch (err) {
  opts = { error: err.message };
}
if (opts.error || !opts.queue) {
  if (opts.error) process.stderr.write(`${opts.error}\n`);
  process.stderr.write("usage: node worker.mjs --queue NAME [--url URL] [--token T] [--worker NAME] [--exit-when-empty]\n"
    + "  [--limit 50] [--lease-seconds 30] [--wait-seconds 5] [--batch-size 25] [--work-ms 0] [--effects-file PATH]\n");
  process.exit(2);
}
const base = opts.url.replace(/\/+$/, "");
const headers = { "content-type": "application/json", accept: "application/json" };
// A bearer token is visible ASCII: anything else (a pasted placeholder such
// as "…") cannot go in a header, and no retry changes that.
if (opts.token && !/^[\x21-\x7e]+$/.test(opts.token)) {
  process.stderr.write("the token (--token or LEDGER_TOKEN) holds characters an HTTP header cannot carry "
    + "(only visible ASCII): give the first line `child-ledger token new` printed\n");
  process.exit(2);
}
if (opts.token) headers.authorization = `Bearer ${opts.token}`;
const exitWhenEmpty = opts["exit-when-empty"];
const limit = Number(opts.limit);
const leaseSeconds = Number(opts["lease-seconds"]);
const waitSeconds = Number(opts["wait-seconds"] ?? (exitWhenEmpty ? 1 : 5));
const batchSize = Number(opts["batch-size"]);
const workMs = Number(opts["work-ms"]);
if ([limit, leaseSeconds, waitSeconds, batchSize, workMs].some((n) => !Number.isInteger(n))) {
  process.stderr.write("--limit, --lease-seconds, --wait-seconds, --batch-size and --work-ms take integers\n");
  process.exit(2);
}
const stats = { claimed: 0, processed: 0, failed: 0, deduplicated: 0, not_applied: 0, released: 0, abandoned: 0 };

/** JSON over HTTP, retrying transient failures. */
async function call(method, path, body, { timeoutMs = 30000, tries = 8, giveUpOnStop = false, traceparent } = {}) {
  let delay = 500;
  for (let attempt = 1; ; attempt++) {
    let why;
    let wait = delay;
    try {
      const response = await fetch(base + path, {
        method,
        headers: traceparent ? { ...headers, traceparent } : headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
      const text = await response.text();
      if (response.ok) return parseAnswer(method, path, text);
      let problem;
      try { problem = JSON.parse(text); } catch { problem = { detail: text }; }
      if (!RETRY_STATUSES.has(response.status)) throw new Problem(response.status, problem ?? {});
      why = `HTTP ${response.status}`;
      // Retry-After in seconds; absent or an HTTP date: our own backoff.
      const retryAfter = Number(response.headers.get("retry-after") ?? NaN);
      if (Number.isFinite(retryAfter)) wait = Math.max(0, retryAfter * 1000);
    } catch (err) {
      if (err instanceof Problem || err instanceof Fatal) throw err;
      // fetch rejects a lost connection with a TypeError whose cause says what
      // happened, and a timeout as a TimeoutError; anything else (a header it
      // refuses, a bad URL) is ours to fix.
      if (!(err.name === "TimeoutError" || (err instanceof TypeError && err.cause))) {
        throw new Fatal(`${method} ${path}: ${err.message}`);
      }
      why = err.cause?.code ?? err.cause?.message ?? err.name; // ECONNREFUSED, UND_ERR_SOCKET, TimeoutError
    }
    if (attempt >= tries || (giveUpOnStop && stopping)) {
      throw new Unavailable(`${method} ${path}: gave up after ${attempt} tries (${why})`);
    }
    log(`${method} ${path}: ${why}; retrying in ${(wait / 1000).toFixed(1)}s`);
    await (giveUpOnStop ? nap(wait) : sleep(wait));
    delay = Math.min(delay * 2, 10000);
  }
}

/** A 2xx answer's JSON; one that is not JSON is not the ledger answering. */
function parseAnswer(method, path, text) {
  try {
    return JSON.parse(text);
  } catch {
    throw new Fatal(`${method} ${path}: the answer is not JSON (is --url the ledger?): ${text.slice(0, 200)}`);
  }
}

// Stand-in for the remote side's idempotency lookup: a JSON-lines file of the
// idempotency keys whose effect has happened (shared by all workers).
const effects = {
  path: opts["effects-file"],
  alreadyDone(key) {
    if (!this.path || !existsSync(this.path)) return false;
    return readFileSync(this.path, "utf8").split("\n").some((line) => {
      try { return JSON.parse(line).key === key; } catch { return false; }
    });
  },
  markDone(key) {
    if (this.path) appendFileSync(this.path, JSON.stringify({ key }) + "\n"); // one O_APPEND write
  },
};

/** The job itself: replace this. Return the JSON result; throw to record `failed`. */
async function doWork(child) {
  if (workMs) await sleep(workMs);
  return { worker: opts.worker, lang: LANG, attempt: child.attempt };
}

/** Extends one claim whenever about a third of its lease remains, until stop().
 *  expired() turns true once the claim holds nothing any more or, judged by our
 *  own clock, the lease may have run out (e.g. the extends kept failing). */
function keepLease(claimId) {
  const lease = { lost: false, done: false, timer: null };
  lease.deadline = performance.now() + leaseSeconds * 1000; // the claim's answer just arrived
  lease.expired = () => lease.lost || performance.now() >= lease.deadline;
  const schedule = () => {
    if (!lease.done) {
      const due = lease.deadline - (leaseSeconds * 1000) / 3 - performance.now();
      lease.timer = setTimeout(tick, Math.max(500, due));
    }
  };
  const tick = async () => {
    const sent = performance.now();
    try {
      const answer = await call("POST", `/v1/claims/${claimId}/extend`, { lease_seconds: leaseSeconds },
        { tries: 3 });
      if (answer.extended === 0) {
        if (!lease.done) log(`claim ${claimId} holds nothing any more: lease lost`);
        lease.lost = true;
        return;
      }
      lease.deadline = sent + leaseSeconds * 1000;
    } catch (err) {
      log(`extend ${claimId}: ${err.message}`);
    }
    schedule();
  };
  schedule();
  lease.stop = () => { lease.done = true; clearTimeout(lease.timer); };
  return lease;
}

/** Returns [outcome item for POST /v1/outcomes, whether the work was skipped as done]. */
async function outcomeFor(claimId, child) {
  const item = { parent_id: child.parent_id, sequence: child.sequence, claim_id: claimId };
  const key = child.idempotency_key;
  if (child.previous_attempt === "expired" && effects.alreadyDone(key)) {
    const result = { worker: opts.worker, lang: LANG, deduplicated: true };
    return [{ ...item, outcome: "processed", result }, true];
  }
  let result;
  try {
    result = await doWork(child);
  } catch (err) { // any failure of the job is the child's outcome
    return [{ ...item, outcome: "failed", reason: `${err.name}: ${err.message}`.slice(0, 1000) }, false];
  }
  effects.markDone(key);
  return [{ ...item, outcome: "processed", result }, false];
}

async function postOutcomes(batch, traceparent) {
  let answer;
  try {
    answer = await call("POST", "/v1/outcomes", { outcomes: batch.map(([item]) => item) }, { traceparent });
  } catch (err) {
    notRecorded(batch, err);
    return;
  }
  countResults(batch, answer.results);
}

function notRecorded(batch, err) {
  log(`${batch.length} outcomes not recorded (the children come back when the lease runs out): `
    + err.message);
  stats.abandoned += batch.length;
}

/** Counts what became of a batch's outcomes (one result per item, in order). */
function countResults(batch, results) {
  results.forEach((result, i) => {
    const [item, deduplicated] = batch[i];
    if (result.status === "applied") {
      stats[item.outcome === "processed" ? "processed" : "failed"] += 1;
      if (deduplicated) stats.deduplicated += 1;
    } else {
      stats.not_applied += 1;
      log(`${item.parent_id}/${item.sequence}: ${result.status}, not applied `
        + "(already terminal; not retried)");
    }
  });
}

async function release(claimId, children) {
  const refs = children.map((c) => ({ parent_id: c.parent_id, sequence: c.sequence }));
  try {
    const answer = await call("POST", `/v1/claims/${claimId}/release`, { children: refs }, { tries: 4 });
    stats.released += answer.released;
    stats.abandoned += refs.length - answer.released; // expired, or already handed to another claim
  } catch (err) {
    log(`release ${claimId}: ${err.message} (the children come back when the lease runs out)`);
    stats.abandoned += refs.length;
  }
}

/** Works a chunk; returns its last batch of outcomes when it goes with the next claim. */
async function workChunk(claimId, children) {
  const started = performance.now();
  const before = { ...stats };
  stats.claimed += children.length;
  const lease = keepLease(claimId);
  const todo = [...children];
  let batch = [];
  let trace = null;
  let carried = [];
  try {
    while (todo.length && !stopping && !lease.expired()) {
      const child = todo.shift();
      // One traceparent per outcome post: a child of another trace context starts a batch.
      if (batch.length && (child.traceparent ?? null) !== trace) {
        await postOutcomes(batch, trace);
        batch = [];
      }
      trace = child.traceparent ?? null;
      if (trace) log(`${child.parent_id}/${child.sequence}: traceparent ${trace}`);
      batch.push(await outcomeFor(claimId, child));
      if (batch.length >= batchSize) {
        await postOutcomes(batch, trace);
        batch = [];
      }
    }
    if (batch.length && (trace || stopping)) await postOutcomes(batch, trace);
    else carried = batch;
  } finally {
    lease.stop();
  }
  if (todo.length) await release(claimId, todo); // never started: give back what this claim still holds
  // Children whose outcome was not recorded (or that were not given back)
  // stay leased to this claim until the lease runs out.
  if (stats.abandoned > before.abandoned) ownLeasesUntil = Math.max(ownLeasesUntil, lease.deadline);
  const delta = Object.fromEntries(
    Object.entries(stats).filter(([k, v]) => v !== before[k]).map(([k, v]) => [k, v - before[k]]),
  );
  const expired = children.filter((c) => c.previous_attempt === "expired").length;
  const riding = carried.length ? `, ${carried.length} outcomes going with the next claim` : "";
  log(`${opts.worker} claim ${claimId}: ${children.length} children (${expired} after an expired lease) `
    + `${JSON.stringify(delta)}${riding} in ${((performance.now() - started) / 1000).toFixed(2)}s`);
  return carried;
}

// Until when (our clock) children this worker abandoned may still be leased to it.
let ownLeasesUntil = 0;

async function run() {
  const body = { limit, lease_seconds: leaseSeconds, worker: opts.worker, wait_seconds: waitSeconds };
  // The last chunk's last outcomes, recorded by the next claim.
  let carried = [];
  while (!stopping) {
    let claim;
    const claimed = performance.now();
    const ask = carried.length ? { ...body, outcomes: carried.map(([item]) => item) } : body;
    try {
      claim = await call("POST", `/v1/queues/${encodeURIComponent(opts.queue)}/claims`, ask,
        { timeoutMs: (waitSeconds + 30) * 1000, giveUpOnStop: true });
    } catch (err) {
      if (!(err instanceof Unavailable)) {
        if (carried.length) notRecorded(carried, err);
        throw err;
      }
      log(`claim: ${err.message}`); // the outcomes it carried go again (a repeat is answered "duplicate")
      continue;
    }
    if (carried.length) countResults(carried, claim.outcome_results);
    carried = [];
    if (claim.children.length) {
      carried = await workChunk(claim.claim_id, claim.children);
    } else if (exitWhenEmpty && claimed > ownLeasesUntil) {
      log("nothing claimable and nothing of ours in flight: exiting");
      return;
    } else if (waitSeconds === 0) {
      await nap(1000);
    }
  }
  if (carried.length) await postOutcomes(carried, null);
}

for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    if (!stopping) log(`${signal}: stopping; finishing the child in hand, releasing the rest`);
    stopping = true;
    for (const wake of [...wakers]) wake();
  });
}

let code = 0;
try {
  await run();
} catch (err) {
  if (!(err instanceof Problem || err instanceof Fatal)) throw err;
  // e.g. 401 for an unknown token, 400 for a bad queue name, 422 for --limit 5000: fix the flags
  log(`giving up: ${err.message}`);
  code = 2;
}
process.stdout.write(JSON.stringify({ worker: opts.worker, lang: LANG, ...stats }) + "\n", () => process.exit(code));
