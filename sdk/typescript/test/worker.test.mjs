// The worker against the real service: outcomes (Failed, Skipped, errors
// retried up to max_attempts, validation), SIGTERM and SIGKILL mid-chunk,
// fatal answers to a claim, and 503/429 retried through a faulty proxy.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { after, before, it } from "node:test";
import { Ledger, Worker, Failed, Skipped, ProblemError } from "child-ledger";
import { FIXTURES, Service, faultProxy, forEachStore, rowsOf, sleep, startWorker, until } from "./helpers.mjs";

const RECORD = join(FIXTURES, "record.mjs");
const FAST = join(FIXTURES, "fast.mjs");
const quiet = { info() {}, warn() {}, error() {} };

/** The handler log's lines of one kind ("start"/"done") as {parent, sequence, attempt, previous, pid}. */
function logLines(path, kind) {
  if (!existsSync(path)) return [];
  return readFileSync(path, "utf8").split("\n").filter((l) => l.startsWith(`${kind} `)).map((l) => {
    const [, parent, sequence, attempt, previous, pid] = l.split(" ");
    return { parent, sequence: Number(sequence), attempt: Number(attempt), previous, pid: Number(pid) };
  });
}

forEachStore((store) => {
  let service;
  let ledger;
  before(async () => {
    service = await new Service(store).start();
    ledger = new Ledger(service.url);
  });
  after(() => service?.cleanup());

  it("records processed, Failed, Skipped, invalid payloads; retries errors up to max_attempts", async () => {
    const kinds = ["ok", "fail", "throw", "skip", "invalid"];
    await ledger.register("outcomes", "w-outcomes", kinds.map((kind) => ({ payload: { kind } })), {
      max_attempts: 3, retry_backoff: { initial_seconds: 0.05, max_seconds: 0.1 },
    });
    const calls = new Map();
    const worker = new Worker(ledger, "w-outcomes", async (child) => {
      calls.set(child.sequence, (calls.get(child.sequence) ?? 0) + 1);
      assert.equal(typeof child.claim_id, "string");
      assert.equal(child.idempotency_key, `outcomes/${child.sequence}`);
      switch (child.payload.kind) {
        case "fail": throw new Failed("bad", { result: { why: "bad" } });
        case "throw": throw new Error(`flaky ${child.attempt}`);
        case "skip": throw new Skipped("not mine");
        default: return { seen: child.payload.kind };
      }
    }, {
      handleSignals: false, waitSeconds: 1, logger: quiet,
      validate: { parse: (p) => { if (p.kind === "invalid") throw new Error("kind is invalid"); return p; } },
    });
    const running = worker.run();
    const parent = await ledger.wait("outcomes", { timeoutMs: 30_000 });
    const stats = await worker.stop();
    assert.deepEqual(await running, stats);
    assert.equal(parent.counts.processed, 1);
    const rows = await rowsOf(ledger, "outcomes");
    const by = Object.fromEntries(rows.map((r) => [kinds[r.sequence], r]));
    assert.deepEqual(by.ok.result, { seen: "ok" });
    assert.equal(by.ok.state, "processed");
    assert.equal(by.fail.state, "failed");
    assert.equal(by.fail.reason, "bad");
    assert.deepEqual(by.fail.result, { why: "bad" });
    assert.equal(by.throw.state, "failed");
    assert.equal(by.throw.attempt, 3);
    assert.match(by.throw.reason, /flaky 3/);
    assert.equal(calls.get(2), 3, "the throwing child ran exactly 3 times");
    assert.equal(by.skip.state, "skipped");
    assert.equal(by.skip.reason, "not mine");
    assert.equal(by.invalid.state, "failed");
    assert.match(by.invalid.reason, /kind is invalid/);
    assert.equal(calls.get(4), undefined, "an invalid payload never reaches the handler");
    assert.equal(stats.released, 2);
    assert.equal(stats.errors, 3);
    assert.equal(stats.processed, 1);
    assert.equal(stats.failed, 3);
    assert.equal(stats.skipped, 1);
  });

  it("stop() abandons an open long poll at once and counts what the claim carried", async () => {
    const worker = new Worker(ledger, "w-poll", () => "ok", { handleSignals: false, waitSeconds: 15, logger: quiet });
    const running = worker.run();
    await sleep(300); // the first claim is long-polling an empty queue
    await ledger.register("poll", "w-poll", [{ payload: 1 }, { payload: 2 }, { payload: 3 }]);
    const parent = await ledger.wait("poll", { timeoutMs: 10_000 });
    assert.equal(parent.counts.processed, 3);
    const t0 = Date.now();
    const stats = await worker.stop();
    assert.ok(Date.now() - t0 < 2000, `stopped in ${Date.now() - t0} ms`);
    assert.deepEqual(await running, stats);
    assert.equal(stats.processed, 3);
    assert.equal(stats.not_applied, 0);
  });

  it("run() rejects at once with the ProblemError of a claim refused with a 4xx (a bad queue name)", async () => {
    const worker = new Worker(ledger, "bad/queue", () => {}, { handleSignals: false, logger: quiet });
    const t0 = Date.now();
    await assert.rejects(worker.run(), (err) => {
      assert.ok(err instanceof ProblemError, String(err));
      assert.ok(err.status >= 400 && err.status < 500 && err.status !== 429);
      assert.equal(err.field, "queue");
      return true;
    });
    assert.ok(Date.now() - t0 < 5000);
  });

  it("SIGTERM mid-chunk: unstarted children released within 1 s, in-flight finish, exit 0, nothing lost", async () => {
    const total = 30;
    await ledger.register("term", "w-term", Array.from({ length: total }, (_, i) => ({ payload: i })));
    const log = join(service.dir, "term.log");
    const env = { HANDLER_LOG: log, HANDLER_SLEEP_MS: "1500" };
    const first = startWorker([RECORD, "--queue", "w-term", "--url", service.url, "--concurrency", "2", "--batch", "10"], { env });
    await until(() => logLines(log, "start").length >= 2, 20_000, "two handlers started");
    first.proc.kill("SIGTERM");
    const t0 = Date.now();
    await until(async () => (await ledger.getParent("term")).counts.pending >= total - 2, 1000, "released children");
    const releasedIn = Date.now() - t0;
    const page = await ledger.listChildren("term", { state: "pending" });
    assert.equal(page.children.filter((c) => c.previous_attempt === "released").length, 8);
    const exit = await first.done;
    assert.equal(exit.code, 0, exit.stderr);
    assert.ok(releasedIn <= 1000);
    assert.equal(logLines(log, "done").length, 2, "the two in flight finished in the grace period");
    const stats = JSON.parse(exit.stdout.trim());
    assert.equal(stats.processed, 2);
    assert.equal(stats.released, 8);

    const second = startWorker([RECORD, "--queue", "w-term", "--url", service.url, "--exit-when-empty", "--wait-seconds", "1"],
      { env: { HANDLER_LOG: log } });
    const exit2 = await second.done;
    assert.equal(exit2.code, 0, exit2.stderr);
    const parent = await ledger.getParent("term");
    assert.equal(parent.counts.processed, total);
    const done = logLines(log, "done");
    assert.equal(done.length, total);
    assert.equal(new Set(done.map((d) => d.sequence)).size, total, "each child handled once");
    assert.equal(done.filter((d) => d.previous === "released").length, 8);
  });

  it("SIGKILL mid-chunk: the children come back with previous_attempt expired and all end processed", async () => {
    const total = 20;
    await ledger.register("kill", "w-kill", Array.from({ length: total }, (_, i) => ({ payload: i })));
    const log = join(service.dir, "kill.log");
    const first = startWorker([RECORD, "--queue", "w-kill", "--url", service.url, "--concurrency", "2", "--batch", "10",
      "--lease-seconds", "2"], { env: { HANDLER_LOG: log, HANDLER_SLEEP_MS: "60000" } });
    await until(() => logLines(log, "start").length >= 2, 20_000, "two handlers started");
    first.proc.kill("SIGKILL");
    await first.done;
    const second = startWorker([RECORD, "--queue", "w-kill", "--url", service.url, "--wait-seconds", "1"],
      { env: { HANDLER_LOG: log } });
    const parent = await ledger.wait("kill", { timeoutMs: 30_000 });
    second.proc.kill("SIGTERM");
    const exit = await second.done;
    assert.equal(exit.code, 0, exit.stderr);
    assert.equal(parent.counts.processed, total);
    const done = logLines(log, "done");
    assert.equal(done.length, total);
    assert.equal(done.filter((d) => d.previous === "expired").length, 10, "the killed worker's chunk came back expired");
    assert.ok(done.filter((d) => d.previous === "expired").every((d) => d.attempt === 2));
  });

  it("401 (unknown token) and 422 (lease-seconds 0) stop the worker within 5 s with exit 2 and the problem", async () => {
    const token = "right-token";
    const tokens = join(service.dir, "tokens.json");
    writeFileSync(tokens, JSON.stringify({ tokens: [
      { name: "w", sha256: createHash("sha256").update(token).digest("hex"), roles: ["worker"], queues: ["*"] },
    ] }));
    const guarded = await new Service(store, ["--tokens-file", tokens]).start();
    try {
      let t0 = Date.now();
      const wrong = await startWorker([FAST, "--queue", "w-auth", "--url", guarded.url, "--token", "wrong-token"]).done;
      assert.ok(Date.now() - t0 < 5000);
      assert.equal(wrong.code, 2);
      assert.match(wrong.stderr, /401/);
      t0 = Date.now();
      const right = await startWorker([FAST, "--queue", "w-auth", "--url", guarded.url, "--exit-when-empty"],
        { env: { LEDGER_TOKEN: token } }).done;
      assert.equal(right.code, 0, right.stderr);
    } finally {
      await guarded.cleanup();
    }
    const t0 = Date.now();
    const bad = await startWorker([FAST, "--queue", "w-auth", "--url", service.url, "--lease-seconds", "0"]).done;
    assert.ok(Date.now() - t0 < 5000);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /422/);
    assert.match(bad.stderr, /lease_seconds/);
  });

  it("503 and 429 answers to claims are retried (Retry-After) and the worker finishes", async () => {
    const total = 50;
    await ledger.register("faulty", "w-faulty", Array.from({ length: total }, (_, i) => ({ payload: i })));
    let claims = 0;
    const proxy = await faultProxy(service.url, (req) => {
      if (!req.url.endsWith("/claims")) return undefined;
      claims++;
      if (claims <= 3) return { status: 503, headers: { "retry-after": "0" } };
      if (claims <= 5) return { status: 429, headers: { "retry-after": "0" } };
      return undefined;
    });
    try {
      const run = await startWorker([FAST, "--queue", "w-faulty", "--url", proxy.url, "--exit-when-empty",
        "--wait-seconds", "1", "--batch", "10"]).done;
      assert.equal(run.code, 0, run.stderr);
      assert.match(run.stderr, /503/);
      assert.match(run.stderr, /429/);
      assert.ok(claims > 5);
    } finally {
      await proxy.close();
    }
    const parent = await ledger.getParent("faulty");
    assert.equal(parent.counts.processed, total);
    await sleep(0);
  });
});
