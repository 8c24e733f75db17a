// At scale: 10,000 children over 4 worker processes, each processed exactly
// once; 1,000,000 children registered from a generator and their results
// streamed back, each in a child process whose RSS stays under 100 MiB.
import assert from "node:assert/strict";
import { after, before, it } from "node:test";
import { join } from "node:path";
import { Ledger } from "child-ledger";
import { FIXTURES, Service, forEachStore, rowsOf, runScript, startWorker } from "./helpers.mjs";

const MiB = 1024 * 1024;
const MILLION = Number(process.env.LEDGER_TEST_MILLION ?? 1_000_000);

/** A child process's source: its RSS (sampled maximum) and VmHWM, printed as JSON with `extra`. */
const measured = (body) => `
import { readFileSync } from "node:fs";
import { Ledger } from "child-ledger";
let max = 0;
const sample = () => { max = Math.max(max, process.memoryUsage().rss); };
const timer = setInterval(sample, 10);
const ledger = new Ledger(process.env.LEDGER_URL);
const t0 = performance.now();
const extra = await (async () => { ${body} })();
sample();
clearInterval(timer);
const hwm = Number(/VmHWM:\\s+(\\d+)/.exec(readFileSync("/proc/self/status", "utf8"))[1]) * 1024;
console.log(JSON.stringify({ rss: max, hwm, seconds: (performance.now() - t0) / 1000, ...extra }));
`;

forEachStore((store) => {
  let service;
  let ledger;
  before(async () => {
    service = await new Service(store).start();
    ledger = new Ledger(service.url);
  });
  after(() => service?.cleanup());

  it("10,000 children of 20 parents over 4 worker processes: each processed exactly once", async () => {
    const sizes = [1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1000, 1000, 1000];
    sizes.push(10_000 - sizes.reduce((a, b) => a + b, 0));
    await Promise.all(sizes.map((n, p) => ledger.register(`fan-${p}`, "fan", Array.from({ length: n }, (_, i) => ({
      payload: { p, i }, key: `k-${p}-${i}`,
    })))));
    const t0 = Date.now();
    const workers = Array.from({ length: 4 }, () => startWorker([join(FIXTURES, "fast.mjs"), "--queue", "fan",
      "--url", service.url, "--concurrency", "8", "--exit-when-empty", "--wait-seconds", "1"]));
    const exits = await Promise.all(workers.map((w) => w.done));
    const seconds = (Date.now() - t0) / 1000;
    for (const exit of exits) assert.equal(exit.code, 0, exit.stderr);
    const stats = exits.map((e) => JSON.parse(e.stdout.trim()));
    assert.equal(stats.reduce((a, s) => a + s.processed, 0), 10_000);
    assert.equal(stats.reduce((a, s) => a + s.not_applied + s.released + s.abandoned, 0), 0);
    const pids = new Set();
    for (const [p, n] of sizes.entries()) {
      const parent = await ledger.getParent(`fan-${p}`);
      assert.equal(parent.complete, true);
      assert.equal(parent.counts.processed, n);
      const rows = await rowsOf(ledger, `fan-${p}`);
      assert.equal(rows.length, n);
      for (const row of rows) {
        assert.equal(row.state, "processed");
        assert.equal(row.attempt, 1, `fan-${p}/${row.sequence} claimed more than once`);
        assert.equal(row.result.sequence, row.sequence);
        pids.add(row.result.pid);
      }
      const report = await ledger.reconcile(`fan-${p}`, { dryRun: true });
      assert.equal(report.dry_run, true);
      assert.deepEqual(report.changes, []);
    }
    assert.ok(pids.size >= 2, `work spread over ${pids.size} workers`);
    process.stderr.write(`# ${store}: 10,000 children over 4 workers in ${seconds.toFixed(1)} s\n`);
  });

  it(`register ${MILLION} children from a generator under 100 MiB, then stream their results under 100 MiB`, async () => {
    const env = { LEDGER_URL: service.url };
    const reg = await runScript(measured(`
      function* children() { for (let i = 0; i < ${MILLION}; i++) yield { payload: { i, pad: "x".repeat(20) } }; }
      const parent = await ledger.register("million", "big", children(), { priority: 1 });
      return { total: parent.counts.total, state: parent.state, decomposed: parent.decomposed_at != null };
    `), { env });
    process.stderr.write(`# ${store}: register ${MILLION}: ${reg.seconds.toFixed(1)} s, RSS sampled max ${(reg.rss / MiB).toFixed(1)} MiB, `
      + `VmHWM ${(reg.hwm / MiB).toFixed(1)} MiB\n`);
    assert.equal(reg.total, MILLION);
    assert.equal(reg.state, "active");
    assert.ok(reg.decomposed);
    assert.ok(reg.rss < 100 * MiB, `register RSS ${(reg.rss / MiB).toFixed(1)} MiB`);
    assert.ok(reg.hwm < 100 * MiB, `register VmHWM ${(reg.hwm / MiB).toFixed(1)} MiB`);

    await ledger.cancel("million", "done with it");
    const res = await runScript(measured(`
      let n = 0, skipped = 0, last = -1, ordered = true;
      for await (const row of ledger.results("million")) {
        n++;
        if (row.state === "skipped") skipped++;
        if (row.sequence !== last + 1) ordered = false;
        last = row.sequence;
      }
      return { n, skipped, ordered };
    `), { env });
    process.stderr.write(`# ${store}: results ${MILLION}: ${res.seconds.toFixed(1)} s, RSS sampled max ${(res.rss / MiB).toFixed(1)} MiB, `
      + `VmHWM ${(res.hwm / MiB).toFixed(1)} MiB\n`);
    assert.equal(res.n, MILLION);
    assert.equal(res.skipped, MILLION);
    assert.ok(res.ordered);
    assert.ok(res.rss < 100 * MiB, `results RSS ${(res.rss / MiB).toFixed(1)} MiB`);
    assert.ok(res.hwm < 100 * MiB, `results VmHWM ${(res.hwm / MiB).toFixed(1)} MiB`);
    const parent = await ledger.getParent("million");
    assert.equal(parent.complete, true);
    assert.equal(parent.verdict, "cancelled");
  });
});
