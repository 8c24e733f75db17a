#!/usr/bin/env node
// child-ledger's side of the cost bench, driven as our users drive it: a
// plain Node worker on the built-in `fetch` (as examples/node/worker.mjs),
// `--concurrency` loops in one process, each claiming `--batch` children of
// one queue and posting their outcomes as one batch, until `--children`
// outcomes have been applied. With `--one-request`, each loop sends a chunk's
// outcomes with its next claim (the claim's `outcomes` member), as
// examples/node/worker.mjs does: one request per chunk instead of two. No
// dependency beyond Node 20.
//
// Output: exactly one JSON line on stdout; logs on stderr.
import { parseArgs } from "node:util";

const { values } = parseArgs({
  options: {
    base: { type: "string", default: "http://127.0.0.1:8080" },
    queue: { type: "string", default: "cost" },
    batch: { type: "string", default: "500" },
    concurrency: { type: "string", default: "8" },
    children: { type: "string" },
    "one-request": { type: "boolean", default: false },
  },
  strict: true,
});
const base = values.base.replace(/\/$/, "");
const batch = Number(values.batch);
const concurrency = Number(values.concurrency);
const total = Number(values.children);
if (!Number.isInteger(batch) || !Number.isInteger(concurrency) || !Number.isInteger(total)) {
  console.error("usage: node ledger.mjs --base URL --queue Q --batch N --concurrency C --children TOTAL [--one-request]");
  process.exit(2);
}

async function call(path, body) {
  const response = await fetch(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response.json();
}

let applied = 0;
let claims = 0;
const started = process.hrtime.bigint();

const claimPath = `/v1/queues/${values.queue}/claims`;
const outcomesOf = (claim) => claim.children.map((c) => ({
  parent_id: c.parent_id,
  sequence: c.sequence,
  outcome: "processed",
  claim_id: claim.claim_id,
}));
const appliedIn = (results) => results.filter((r) => r.status === "applied").length;

/** A claim, then its outcomes as one batch: two requests per chunk. */
async function loop(worker) {
  while (applied < total) {
    const claim = await call(claimPath, { limit: batch, worker: `node-${worker}` });
    claims += 1;
    if (claim.children.length === 0) {
      // Another loop holds the last children; look again shortly.
      await new Promise((r) => setTimeout(r, 5));
      continue;
    }
    const { results } = await call("/v1/outcomes", { outcomes: outcomesOf(claim) });
    applied += appliedIn(results);
  }
}

/** Each chunk's outcomes go with the next claim: one request per chunk. */
async function loopOneRequest(worker) {
  let outcomes = [];
  while (applied < total || outcomes.length) {
    const body = { limit: batch, worker: `node-${worker}` };
    if (outcomes.length) body.outcomes = outcomes;
    const claim = await call(claimPath, body);
    claims += 1;
    if (claim.outcome_results) applied += appliedIn(claim.outcome_results);
    if (claim.children.length === 0 && !outcomes.length) {
      await new Promise((r) => setTimeout(r, 5));
    }
    outcomes = outcomesOf(claim);
  }
}

const run = values["one-request"] ? loopOneRequest : loop;
await Promise.all(Array.from({ length: concurrency }, (_, i) => run(i)));
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
console.error(`node worker: ${applied} outcomes in ${seconds.toFixed(2)} s over ${claims} claims`);
process.stdout.write(
  JSON.stringify({ children_per_second: applied / seconds, seconds, applied, claims }) + "\n",
);
