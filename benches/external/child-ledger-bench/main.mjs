#!/usr/bin/env node
// Long-horizon adapter for hardbyte/postgresql-job-queue-benchmarking: one
// child-ledger service (spawned here, or reached at CHILD_LEDGER_URL) on the
// harness's DATABASE_URL, a producer that registers one parent of at most
// PRODUCER_BATCH_MAX children per tick, and WORKER_COUNT plain `fetch`
// workers that claim chunks under a lease and send each chunk's outcomes with
// their next claim. Node 20+, no packages. stdout is the harness's JSONL
// telemetry; everything else goes to stderr. See ../README.md.
import { spawn, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";

const SYSTEM = "child-ledger";
const WINDOW_S = 30;
const here = dirname(fileURLToPath(import.meta.url));

const env = (key, fallback) => process.env[key] ?? fallback;
function envInt(key, fallback) {
  const raw = process.env[key];
  if (raw === undefined || raw === "") return fallback;
  const n = Number.parseInt(raw, 10);
  if (!Number.isFinite(n)) throw new Error(`${key} must be an integer, got ${JSON.stringify(raw)}`);
  return n;
}

const instance = envInt("BENCH_INSTANCE_ID", 0);
const observer = instance === 0;
const sampleEveryS = Math.max(1, envInt("SAMPLE_EVERY_S", 5));
const producerMode = env("PRODUCER_MODE", "fixed");
const producerRate = envInt("PRODUCER_RATE", 800);
const targetDepth = envInt("TARGET_DEPTH", 1000);
const workerCount = Math.max(1, envInt("WORKER_COUNT", 32));
const payloadBytes = envInt("JOB_PAYLOAD_BYTES", 256);
const workMs = envInt("JOB_WORK_MS", 1);
const batchMs = Math.max(1, envInt("PRODUCER_BATCH_MS", 10));
const batchMax = Math.max(1, Math.min(10_000, envInt("PRODUCER_BATCH_MAX", 128)));
// pg-boss's adapter sizes its fetches this way; the same rule keeps the two comparable.
const chunk = envInt(
  "SUBSCRIBER_BATCH_SIZE",
  Math.max(1, Math.min(64, Math.ceil((producerRate * 1.25) / Math.max(workerCount * 2, 1)))),
);
const leaseSeconds = envInt("LEASE_SECONDS", 30);
const waitSeconds = envInt("CLAIM_WAIT_SECONDS", 5);
const queue = env("BENCH_QUEUE", "long_horizon_bench");
// The harness's high-load phase writes the raised rate here (and the base
// rate back after it); pg-boss's adapter reads it the same way.
const rateControlFile = process.env.PRODUCER_RATE_CONTROL_FILE;
const runId = randomBytes(4).toString("hex");

const log = (...args) => console.error(`[${SYSTEM}#${instance}]`, ...args);
const emit = (record) => process.stdout.write(`${JSON.stringify({ instance_id: instance, ...record })}\n`);
const nowMs = () => Number(process.hrtime.bigint() / 1_000_000n);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Latencies of the last 30 s in bounded memory: one map per second from a
 * value rounded to 3 significant figures to its count (an HDR histogram's
 * precision), 30 of them in a ring.
 */
class RollingHistogram {
  constructor(seconds) {
    this.slots = Array.from({ length: seconds }, () => ({ second: -1, counts: new Map() }));
  }
  static bucket(v) {
    if (!(v > 0)) return 0;
    const magnitude = 10 ** (Math.floor(Math.log10(v)) - 2);
    return Math.round(v / magnitude) * magnitude;
  }
  record(ms) {
    const second = Math.floor(Date.now() / 1000);
    const slot = this.slots[second % this.slots.length];
    if (slot.second !== second) {
      slot.second = second;
      slot.counts.clear();
    }
    const key = RollingHistogram.bucket(ms);
    slot.counts.set(key, (slot.counts.get(key) ?? 0) + 1);
  }
  percentiles(...ps) {
    const since = Math.floor(Date.now() / 1000) - this.slots.length;
    const merged = new Map();
    let total = 0;
    for (const slot of this.slots) {
      if (slot.second <= since) continue;
      for (const [k, n] of slot.counts) {
        merged.set(k, (merged.get(k) ?? 0) + n);
        total += n;
      }
    }
    if (total === 0) return ps.map(() => 0);
    const keys = [...merged.keys()].sort((a, b) => a - b);
    return ps.map((p) => {
      const rank = Math.max(1, Math.ceil(p * total));
      let seen = 0;
      for (const k of keys) {
        seen += merged.get(k);
        if (seen >= rank) return k;
      }
      return keys[keys.length - 1];
    });
  }
}

// ─── The service ────────────────────────────────────────────────────────

let service = null;
let serviceVersion = "unknown";
let base = process.env.CHILD_LEDGER_URL?.replace(/\/$/, "");

async function startService() {
  const bin = env("CHILD_LEDGER_BIN", resolve(here, "../../../target/release/child-ledger"));
  const port = envInt("CHILD_LEDGER_PORT", 18300 + instance);
  const args = [
    "serve",
    "--listen", `127.0.0.1:${port}`,
    "--database-url", env("DATABASE_URL", ""),
    ...env("CHILD_LEDGER_ARGS", "").split(/\s+/).filter(Boolean),
  ];
  // The service dies with this process, as a job queue's workers die with
  // theirs when the harness kills a replica.
  const setpriv = spawnSync("setpriv", ["--version"]).status === 0;
  // `child-ledger 0.1.0`: /healthz does not say.
  serviceVersion = spawnSync(bin, ["--version"], { encoding: "utf8" }).stdout?.trim().split(/\s+/).pop() || "unknown";
  const [cmd, argv] = setpriv ? ["setpriv", ["--pdeathsig", "KILL", "--", bin, ...args]] : [bin, args];
  service = spawn(cmd, argv, { stdio: ["ignore", 2, 2] });
  service.on("exit", (code, signal) => {
    if (!stopping) {
      log(`service exited (${code ?? signal}); stopping`);
      process.exit(1);
    }
  });
  base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    try {
      if ((await fetch(`${base}/readyz`)).ok) return;
    } catch {
      // not listening yet
    }
    await sleep(100);
  }
  throw new Error(`the service at ${base} was not ready within 60 s`);
}

class Refused extends Error {}

/** One JSON request; 5xx, 429 and connection errors are retried by the caller. */
async function call(method, path, body) {
  const response = await fetch(`${base}${path}`, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (response.status >= 500 || response.status === 429) throw new Refused(`${method} ${path}: ${response.status} ${text.slice(0, 200)}`);
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text.slice(0, 500)}`);
  return JSON.parse(text);
}

/** Retries what a restart, a killed backend or a full pool refuses. */
async function persist(what, fn) {
  for (let attempt = 0; ; attempt += 1) {
    try {
      return await fn();
    } catch (err) {
      if (stopping && attempt > 0) throw err;
      if (!(err instanceof Refused) && !(err instanceof TypeError)) throw err;
      retried += 1;
      if (attempt % 20 === 0) log(`${what}: ${err.message}; retrying`);
      await sleep(Math.min(1000, 50 * 2 ** Math.min(attempt, 5)));
    }
  }
}

// ─── Counters and the run ───────────────────────────────────────────────

let stopping = false;
let enqueued = 0;
let completed = 0;
let retried = 0;
let claims = 0;
let emptyClaims = 0;
let queueDepth = 0;
const claimLatency = new RollingHistogram(WINDOW_S);
const endToEnd = new RollingHistogram(WINDOW_S);
const producerLatency = new RollingHistogram(WINDOW_S);
const padding = "x".repeat(Math.max(0, payloadBytes - 64));

let targetRate = producerRate;
let targetRateReadAt = -Infinity;

/** The offered rate now: PRODUCER_RATE, or what the control file says (read at most every 250 ms). */
function currentRate() {
  if (!rateControlFile) return producerRate;
  const now = nowMs();
  if (now - targetRateReadAt >= 250) {
    targetRateReadAt = now;
    try {
      const value = Number.parseFloat(readFileSync(rateControlFile, "utf8").trim());
      if (Number.isFinite(value) && value >= 0) targetRate = value;
    } catch {
      // missing or half-written: keep the last rate
    }
  }
  return targetRate;
}

async function produce() {
  let parents = 0;
  let credit = 0;
  let last = nowMs();
  while (!stopping) {
    let count;
    if (producerMode === "depth-target") {
      count = Math.max(0, Math.min(batchMax, targetDepth - queueDepth));
    } else {
      const now = nowMs();
      // Credited on real elapsed time, and kept across a stall (a restart, a
      // killed backend): the offered load is not under-metered, and the
      // arrears go out at one parent of at most PRODUCER_BATCH_MAX per tick.
      credit += (currentRate() * (now - last)) / 1000;
      last = now;
      count = Math.min(batchMax, Math.floor(credit));
      credit -= count;
    }
    if (count === 0) {
      await sleep(batchMs);
      continue;
    }
    const parentId = `lh-${runId}-${instance}-${parents++}`;
    const at = Date.now();
    const children = Array.from({ length: count }, (_, i) => ({ payload: { i, enqueued_at_ms: at, padding } }));
    const started = nowMs();
    // PUT is idempotent: a registration retried after a refused or lost answer writes nothing twice.
    await persist("register", () => call("PUT", `/v1/parents/${parentId}`, { queue, children }));
    const perChild = (nowMs() - started) / count;
    for (let i = 0; i < count; i += 1) producerLatency.record(perChild);
    enqueued += count;
    if (producerMode === "depth-target") queueDepth += count;
    const pause = batchMs - (nowMs() - started);
    if (pause > 0) await sleep(pause);
  }
}

/** One worker: claim a chunk, do it, and send its outcomes with the next claim. */
async function work(n) {
  const worker = `lh-${instance}-${n}`;
  let outcomes = [];
  while (!stopping || outcomes.length) {
    const body = { limit: chunk, lease_seconds: leaseSeconds, worker };
    if (outcomes.length) body.outcomes = outcomes;
    else if (!stopping) body.wait_seconds = waitSeconds;
    if (stopping) body.limit = 1; // the outcomes must land; take as little as the API allows
    let claim;
    try {
      claim = await persist("claim", () => call("POST", `/v1/queues/${queue}/claims`, body));
    } catch (err) {
      if (stopping) return;
      throw err;
    }
    claims += 1;
    if (claim.children.length === 0) emptyClaims += 1;
    if (claim.outcome_results) {
      completed += claim.outcome_results.filter((r) => r.status === "applied").length;
    }
    outcomes = [];
    if (stopping && claim.children.length) {
      // Shutting down: give back what the last claim took, so nothing waits out a lease.
      await call("POST", `/v1/claims/${claim.claim_id}/release`, {}).catch(() => {});
      return;
    }
    if (claim.children.length === 0) continue;
    const startedAt = Date.now();
    for (const c of claim.children) claimLatency.record(startedAt - c.payload.enqueued_at_ms);
    if (workMs > 0) await sleep(workMs * claim.children.length);
    const doneAt = Date.now();
    for (const c of claim.children) endToEnd.record(doneAt - c.payload.enqueued_at_ms);
    outcomes = claim.children.map((c) => ({
      parent_id: c.parent_id,
      sequence: c.sequence,
      outcome: "processed",
      claim_id: claim.claim_id,
    }));
  }
}

async function watchDepth() {
  while (!stopping) {
    try {
      const q = await call("GET", `/v1/queues/${queue}`);
      queueDepth = q.children.pending;
    } catch {
      // 404 before the first parent; a refused read is tried again
    }
    await sleep(250);
  }
}

async function sample() {
  const period = sampleEveryS * 1000;
  await sleep(period - (Date.now() % period)); // aligned to the wall clock
  let lastEnqueued = enqueued;
  let lastCompleted = completed;
  while (!stopping) {
    const t = new Date().toISOString();
    const [c50, c95, c99] = claimLatency.percentiles(0.5, 0.95, 0.99);
    const [e50, e95, e99] = endToEnd.percentiles(0.5, 0.95, 0.99);
    const [p50, p95, p99] = producerLatency.percentiles(0.5, 0.95, 0.99);
    const metrics = [
      ["claim_p50_ms", c50, WINDOW_S],
      ["claim_p95_ms", c95, WINDOW_S],
      ["claim_p99_ms", c99, WINDOW_S],
      ["subscriber_p50_ms", c50, WINDOW_S],
      ["subscriber_p95_ms", c95, WINDOW_S],
      ["subscriber_p99_ms", c99, WINDOW_S],
      ["end_to_end_p50_ms", e50, WINDOW_S],
      ["end_to_end_p95_ms", e95, WINDOW_S],
      ["end_to_end_p99_ms", e99, WINDOW_S],
      ["producer_p50_ms", p50, WINDOW_S],
      ["producer_p95_ms", p95, WINDOW_S],
      ["producer_p99_ms", p99, WINDOW_S],
      // Per sample period, not per second elapsed: the harness sums rate ×
      // window_s, which then gives every job back exactly, even after a late tick.
      ["enqueue_rate", (enqueued - lastEnqueued) / sampleEveryS, sampleEveryS],
      ["completion_rate", (completed - lastCompleted) / sampleEveryS, sampleEveryS],
      ["enqueued_total", enqueued, 0],
      ["completed_total", completed, 0],
      ["retried_requests", retried, 0],
      ["claims_total", claims, 0],
      ["empty_claims_total", emptyClaims, 0],
    ];
    if (observer) {
      metrics.push(["queue_depth", queueDepth, 0], ["producer_target_rate", currentRate(), 0]);
    }
    lastEnqueued = enqueued;
    lastCompleted = completed;
    for (const [metric, value, window_s] of metrics) {
      emit({ t, system: SYSTEM, kind: "adapter", subject_kind: "adapter", subject: "", metric, value, window_s });
    }
    await sleep(period - (Date.now() % period));
  }
}

async function main() {
  if (env("SCENARIO", "long_horizon") !== "long_horizon") {
    throw new Error(`unsupported SCENARIO ${process.env.SCENARIO}: this adapter runs long_horizon`);
  }
  if (!base) await startService();
  emit({
    kind: "descriptor",
    system: SYSTEM,
    event_tables: ["public.parent", "public.lane", "public.claim_lease", "public.child"],
    extensions: [],
    version: `child-ledger@${serviceVersion}`,
    schema_version: "migrations",
    db_name: (process.env.DATABASE_URL ?? "").split("/").pop()?.split("?")[0] ?? "",
    started_at: new Date().toISOString(),
  });
  log(`queue ${queue}: ${workerCount} workers claiming ${chunk} at a time, ${producerMode} producer at ${producerRate}/s in parents of up to ${batchMax}`);

  // The harness may write ENQUEUE tokens to stdin (PRODUCER_PACING=harness);
  // this adapter paces itself, but reads them away so the pipe never fills:
  // the harness blocks closing a full one when it stops or kills a replica.
  process.stdin.on("data", () => {});
  process.stdin.on("error", () => {});

  let stop;
  const stopped = new Promise((r) => (stop = r));
  for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => stop());
  const tasks = [produce(), watchDepth(), sample(), ...Array.from({ length: workerCount }, (_, i) => work(i))];
  const failed = Promise.race(tasks.map((t) => t.then(() => new Promise(() => {}))));
  await Promise.race([stopped, failed]);
  stopping = true;
  // Samples flush, the last outcomes land, and the service stops, within the harness's 5 s.
  const grace = sleep(3_500);
  await Promise.race([Promise.allSettled(tasks), grace]);
  log(`stopping: ${enqueued} enqueued, ${completed} completed, ${retried} requests retried`);
  if (service) {
    service.kill("SIGTERM");
    await Promise.race([new Promise((r) => service.once("exit", r)), sleep(1_000)]);
  }
  process.exit(0);
}

main().catch((err) => {
  log("fatal:", err?.stack ?? err);
  if (service) service.kill("SIGKILL");
  process.exit(1);
});
