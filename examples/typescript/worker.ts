// A worker: charge each order once, even across crashes and retries.
//
//     cd examples/typescript && npm install && npm run build
//     node dist/worker.js --queue events [--url http://127.0.0.1:8080] [--exit-when-empty]
//
// The SDK claims children in chunks, extends their leases while the handler
// runs, records each outcome (riding on the next claim), and on Ctrl-C or
// SIGTERM gives back what it has not started and lets the rest finish.
import { parseArgs } from "node:util";
import { Failed, Ledger, Worker, type Child } from "child-ledger";

interface Order {
  event: number;
  customer: string;
}

// Payloads are checked at the edge: a function (or a zod schema) that throws
// records the child as failed, with the error as its reason.
function order(payload: unknown): Order {
  const p = payload as Partial<Order> | null;
  if (typeof p?.event !== "number") throw new Error("payload.event must be a number");
  if (typeof p.customer !== "string") throw new Failed("no customer id");
  return { event: p.event, customer: p.customer };
}

// Stands in for the remote side (a payment API): what it has done, by idempotency key.
const charged = new Map<string, string>();

async function charge(child: Child<Order>): Promise<{ charge: string; deduplicated?: boolean }> {
  const done = charged.get(child.idempotency_key);
  if (child.previous_attempt === "expired" && done) {
    // An earlier holder may have charged before it died: look it up, don't repeat it.
    return { charge: done, deduplicated: true };
  }
  const id = `ch-${child.parent_id}-${child.sequence}-${child.payload.customer}`; // the remote call
  charged.set(child.idempotency_key, id);
  return { charge: id }; // processed, with this result; throw Failed(reason) for failed;
  // any other error releases the child for another attempt (with backoff).
}

const { values } = parseArgs({
  options: {
    queue: { type: "string", default: "events" },
    url: { type: "string" }, // default: LEDGER_URL or http://127.0.0.1:8080
    concurrency: { type: "string", default: "8" },
    "exit-when-empty": { type: "boolean", default: false },
  },
});
const worker = new Worker(new Ledger(values.url), values.queue!, charge, {
  concurrency: Number(values.concurrency),
  validate: order,
  exitWhenEmpty: values["exit-when-empty"],
});
console.log(await worker.run()); // resolves on SIGTERM/Ctrl-C (or when empty), in-flight work recorded
