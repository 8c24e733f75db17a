// The client against the real service: problem errors, retries and
// Retry-After, register (one request, paged, idempotent), watch across a
// service restart, wait, results and the thin calls.
import assert from "node:assert/strict";
import { after, before, it } from "node:test";
import {
  Ledger, ProblemError, NotFound, BadRequest, Conflict, TooManyRequests, UnavailableError, PAGE_CHILDREN,
} from "child-ledger";
import { Service, faultProxy, forEachStore, freePort, rowsOf, sleep } from "./helpers.mjs";

forEachStore((store) => {
  let service;
  let ledger;
  before(async () => {
    service = await new Service(store).start();
    ledger = new Ledger(service.url);
  });
  after(() => service?.cleanup());

  it("problem errors carry status, type, title, detail and field", async () => {
    await assert.rejects(ledger.getParent("no-such-parent"), (err) => {
      assert.ok(err instanceof NotFound && err instanceof ProblemError);
      assert.equal(err.status, 404);
      assert.match(err.type, /not-found/);
      assert.ok(err.title.length > 0);
      assert.match(err.detail, /no-such-parent/);
      assert.equal(err.problem.status, 404);
      assert.match(err.message, /404/);
      return true;
    });
    await assert.rejects(ledger.register("bad-priority", "q", [{ payload: 1 }], { priority: 1000 }), (err) => {
      assert.ok(err instanceof BadRequest);
      assert.equal(err.status, 422);
      assert.equal(err.field, "priority");
      assert.match(err.message, /priority/);
      return true;
    });
  });

  it("retries 429 honouring Retry-After, surfaces it when retries run out", async () => {
    await ledger.register("retry-after", "q", [{ payload: 1 }]);
    let left = 1;
    const proxy = await faultProxy(service.url, (req) => (req.method === "GET" && left-- > 0
      ? { status: 429, headers: { "retry-after": "1" } } : undefined));
    try {
      const t0 = Date.now();
      const parent = await new Ledger(proxy.url).getParent("retry-after");
      const took = Date.now() - t0;
      assert.equal(parent.parent_id, "retry-after");
      assert.ok(took >= 950, `retried after ${took} ms, before Retry-After: 1`);
      assert.equal(proxy.seen.length, 2);
      left = 5;
      await assert.rejects(new Ledger(proxy.url, { retries: 1 }).getParent("retry-after"), (err) => {
        assert.ok(err instanceof TooManyRequests);
        assert.equal(err.status, 429);
        return true;
      });
    } finally {
      await proxy.close();
    }
    const closed = await freePort();
    await assert.rejects(new Ledger(`http://127.0.0.1:${closed}`, { retries: 1 }).getParent("x"), UnavailableError);
  });

  it("register: one request, idempotent on repeat, 409 on different content", async () => {
    const children = Array.from({ length: 100 }, (_, i) => ({ payload: { i }, key: `k${i}` }));
    const first = await ledger.register("small", "q", children, { max_attempts: 2 });
    assert.equal(first.counts.total, 100);
    assert.equal(first.state, "active");
    const again = await ledger.register("small", "q", children, { max_attempts: 2 });
    assert.equal(again.counts.total, 100);
    await assert.rejects(ledger.register("small", "q", children.slice(1), { max_attempts: 2 }), Conflict);
    const skipped = await ledger.register("with-skip", "q", [{ payload: 1 }, { payload: 2, skip: "invalid" }]);
    assert.equal(skipped.counts.skipped, 1);
  });

  it("register pages past 10,000 children from an async generator, and a repeat sends no page", async () => {
    const total = 2 * PAGE_CHILDREN + 1234;
    async function* gen() {
      for (let i = 0; i < total; i++) yield { payload: { i }, key: `c${i}` };
    }
    const proxy = await faultProxy(service.url, () => undefined);
    try {
      const through = new Ledger(proxy.url);
      const parent = await through.register("paged", "q", gen(), { priority: 5 });
      assert.equal(parent.counts.total, total);
      assert.equal(parent.state, "active");
      assert.deepEqual(proxy.seen.filter((s) => s.startsWith("POST")).length, 4, proxy.seen.join(", ")); // 3 pages + seal
      proxy.seen.length = 0;
      const again = await through.register("paged", "q", gen(), { priority: 5 });
      assert.equal(again.counts.total, total);
      assert.deepEqual(proxy.seen, ["PUT /v1/parents/paged"]);
    } finally {
      await proxy.close();
    }
    const rows = await rowsOf(ledger, "paged");
    assert.equal(rows.length, total);
    assert.ok(rows.every((r, i) => r.sequence === i && r.key === `c${i}` && r.state === "pending"));
  });

  it("watch survives a service restart and yields completed once; wait gives the verdict", async () => {
    await ledger.register("watched", "wq", [{ payload: 1 }, { payload: 2 }]);
    const events = [];
    let sawSnapshot;
    const snapshot = new Promise((r) => { sawSnapshot = r; });
    const watching = (async () => {
      for await (const ev of ledger.watch("watched")) {
        events.push(ev);
        if (ev.event === "snapshot") sawSnapshot();
      }
    })();
    await snapshot;
    await service.restart();
    const claim = await ledger.claim("wq", { limit: 10 });
    assert.equal(claim.children.length, 2);
    const answer = await ledger.recordOutcomes(claim.children.map((c) => ({
      parent_id: c.parent_id, sequence: c.sequence, outcome: "processed", claim_id: claim.claim_id,
    })));
    assert.deepEqual(answer.results.map((r) => r.status), ["applied", "applied"]);
    await watching;
    const names = events.map((e) => e.event);
    assert.equal(names.filter((n) => n === "completed").length, 1, names.join(","));
    assert.equal(names.at(-1), "completed");
    assert.ok(names.filter((n) => n === "snapshot").length >= 2, `reconnected: ${names.join(",")}`);
    const done = await ledger.wait("watched", { timeoutMs: 10_000 });
    assert.equal(done.verdict, "succeeded");
    assert.equal(done.counts.processed, 2);
  });

  it("wait times out on an open parent; watchQueue stops on abort", async () => {
    await ledger.register("open", "oq", [{ payload: 1 }]);
    await assert.rejects(ledger.wait("open", { timeoutMs: 300 }), /did not complete/);
    const controller = new AbortController();
    const seen = [];
    const giveUp = setTimeout(() => controller.abort(new Error("no pause seen in 10 s")), 10_000);
    await assert.rejects((async () => {
      for await (const ev of ledger.watchQueue("oq", { signal: controller.signal })) {
        seen.push(ev.event);
        if (ev.event === "snapshot") await ledger.pause("oq");
        // The queue's own stream says the pause with a `paused` event.
        if (ev.event === "paused") controller.abort();
      }
    })(), (err) => err.name === "AbortError");
    clearTimeout(giveUp);
    assert.equal(seen[0], "snapshot");
    assert.ok(seen.includes("paused"), seen.join(","));
    const queue = await ledger.getQueue("oq");
    assert.equal(queue.paused, true);
    await ledger.resume("oq");
  });

  it("thin calls: summary, cancel, results by state, retry, reconcile, limits", async () => {
    await ledger.register("thin", "tq", Array.from({ length: 5 }, (_, i) => ({ payload: i })));
    const claim = await ledger.claim("tq", { limit: 2, lease_seconds: 30 });
    await ledger.recordOutcome("thin", claim.children[0].sequence, { outcome: "failed", reason: "boom", claim_id: claim.claim_id });
    const extended = await ledger.extend(claim.claim_id, 30);
    assert.equal(extended.extended, 1);
    const released = await ledger.release(claim.claim_id);
    assert.equal(released.released, 1);
    const summary = await ledger.summary("thin");
    assert.equal(summary.counts.failed, 1);
    await assert.rejects(ledger.retry("thin", { sequence: claim.children[0].sequence }), Conflict); // terminal is one-way
    const retried = await ledger.retry("thin", { states: ["held"] });
    assert.ok(retried);
    const cancelled = await ledger.cancel("thin", "enough");
    assert.ok(cancelled);
    const skipped = await rowsOf(ledger, "thin", { state: "skipped" });
    assert.equal(skipped.length, 4);
    assert.ok(skipped.every((r) => r.reason === "enough"));
    assert.equal((await rowsOf(ledger, "thin")).length, 5);
    const report = await ledger.reconcile("thin", { dryRun: true });
    assert.ok(report);
    const limits = await ledger.setLimits("tq", { max_in_flight: 7 });
    assert.equal(limits.max_in_flight, 7);
    assert.equal((await ledger.limits("tq")).max_in_flight, 7);
    const list = await ledger.listParents({ queue: "tq" });
    assert.deepEqual(list.parents.map((p) => p.parent_id), ["thin"]);
    await sleep(0);
  });
});
