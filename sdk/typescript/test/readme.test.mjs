// Every JavaScript sample of the package's README runs as written, against a
// real service (LEDGER_URL), and the handler sample runs under the CLI.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, it } from "node:test";
import { Ledger } from "child-ledger";
import { Service, forEachStore, startWorker } from "./helpers.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const readme = readFileSync(new URL("../README.md", import.meta.resolve("child-ledger")), "utf8");
const samples = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);

function runNode(file, env) {
  return new Promise((resolve) => {
    execFile(process.execPath, [file], { env: { ...process.env, ...env }, timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (error.code ?? 1) : 0, stdout, stderr });
    });
  });
}

forEachStore((store) => {
  let service;
  let dir;
  before(async () => {
    service = await new Service(store).start();
    dir = join(here, `.readme-${store}-${process.pid}`);
    mkdirSync(dir, { recursive: true });
  });
  after(async () => {
    rmSync(dir, { recursive: true, force: true });
    await service?.cleanup();
  });

  it("the README has a quickstart, an errors sample, a handler and a paging sample", () => {
    assert.ok(samples.length >= 4, `${samples.length} samples`);
    assert.ok(samples[0].split("\n").filter(Boolean).length <= 15, "the quickstart fits 15 lines");
  });

  it("each script sample runs as written, twice (register is safe to repeat)", async () => {
    const scripts = samples.filter((s) => !s.startsWith("// handler.mjs"));
    for (const [i, source] of scripts.entries()) {
      const file = join(dir, `sample-${i}.mjs`);
      writeFileSync(file, source);
      for (const round of [1, 2]) {
        const run = await runNode(file, { LEDGER_URL: service.url });
        assert.equal(run.code, 0, `sample ${i} (round ${round}):\n${source}\n${run.stderr}`);
      }
    }
    const quick = await runNode(join(dir, "sample-0.mjs"), { LEDGER_URL: service.url });
    assert.match(quick.stdout, /^succeeded 100$/m);
  });

  it("the handler sample runs under child-ledger-worker", async () => {
    const source = samples.find((s) => s.startsWith("// handler.mjs"));
    writeFileSync(join(dir, "handler.mjs"), source);
    const ledger = new Ledger(service.url);
    await ledger.register("cli-sample", "squares", [{ payload: { n: 3 } }, { payload: { n: "x" } }]);
    const exit = await startWorker(["./handler.mjs", "--queue", "squares", "--url", service.url, "--exit-when-empty"],
      { cwd: dir }).done;
    assert.equal(exit.code, 0, exit.stderr);
    const rows = [];
    for await (const row of ledger.results("cli-sample")) rows.push(row);
    assert.deepEqual(rows.map((r) => [r.state, r.result ?? r.reason]), [["processed", { square: 9 }], ["failed", "n is not a number"]]);
  });
});
