// Test helpers: the real service (SQLite or Postgres), worker processes, a
// fault-injecting proxy. Tests import the package by name (`child-ledger`), so
// they run the same against the checkout and against an installed tarball.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, openSync, closeSync, readFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";

const here = dirname(fileURLToPath(import.meta.url));
export const BIN = process.env.CHILD_LEDGER_BIN ?? resolve(here, "../../../target/release/child-ledger");
export const CLI = fileURLToPath(new URL("./cli.js", import.meta.resolve("child-ledger")));
export const FIXTURES = join(here, "fixtures");
const ADMIN_URL = process.env.LEDGER_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function postgresAnswers() {
  try {
    execFileSync("psql", [ADMIN_URL, "-tAc", "SELECT 1"], { stdio: "pipe", timeout: 5000 });
    return true;
  } catch {
    return false;
  }
}

/**
 * Runs `body(store)` inside a describe per store of LEDGER_TEST_STORES
 * (default sqlite,postgres). Postgres not answering skips its suite, or fails
 * it with LEDGER_REQUIRE_POSTGRES=1.
 */
export function forEachStore(body) {
  const stores = (process.env.LEDGER_TEST_STORES ?? "sqlite,postgres").split(",").map((s) => s.trim()).filter(Boolean);
  for (const store of stores) {
    if (store === "postgres" && !postgresAnswers()) {
      if (process.env.LEDGER_REQUIRE_POSTGRES === "1") {
        describe(store, () => it("needs Postgres (LEDGER_REQUIRE_POSTGRES=1)", () => {
          throw new Error(`Postgres does not answer at ${ADMIN_URL}`);
        }));
      } else {
        describe(store, { skip: `Postgres does not answer at ${ADMIN_URL}` }, () => {});
      }
      continue;
    }
    describe(store, { concurrency: false }, () => body(store));
  }
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

let dbCounter = 0;

/** One service process on its own database; restartable on the same port and database. */
export class Service {
  constructor(store, extraArgs = []) {
    this.store = store;
    this.extraArgs = extraArgs;
    this.dir = mkdtempSync(join(tmpdir(), "cl-ts-"));
    this.logPath = join(this.dir, "service.log");
  }

  async start() {
    if (!this.port) {
      this.port = await freePort();
      if (this.store === "postgres") {
        this.db = `cl_ts_${process.pid}_${Date.now() % 1e6}_${dbCounter++}`;
        execFileSync("psql", [ADMIN_URL, "-qc", `CREATE DATABASE ${this.db}`], { stdio: "pipe" });
        const u = new URL(ADMIN_URL);
        u.pathname = `/${this.db}`;
        this.databaseUrl = u.toString();
      } else {
        this.databaseUrl = `sqlite://${join(this.dir, "ledger.db")}`;
      }
    }
    this.url = `http://127.0.0.1:${this.port}`;
    const log = openSync(this.logPath, "a");
    this.proc = spawn(BIN, ["serve", "--listen", `127.0.0.1:${this.port}`, "--database-url", this.databaseUrl,
      "--reap-interval-ms", "200", "--shutdown-grace-seconds", "2", ...this.extraArgs],
    { stdio: ["ignore", log, log] });
    closeSync(log);
    this.exited = new Promise((r) => this.proc.once("exit", r));
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (this.proc.exitCode !== null) throw new Error(`service exited: ${readFileSync(this.logPath, "utf8").slice(-2000)}`);
      try {
        const r = await fetch(`${this.url}/readyz`);
        await r.text();
        if (r.status === 200) return this;
      } catch { /* not yet */ }
      if (Date.now() > deadline) throw new Error(`service not ready: ${readFileSync(this.logPath, "utf8").slice(-2000)}`);
      await sleep(50);
    }
  }

  async stop(signal = "SIGTERM") {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill(signal);
    const killer = setTimeout(() => this.proc.kill("SIGKILL"), 10_000);
    await this.exited;
    clearTimeout(killer);
  }

  async restart() {
    await this.stop();
    await this.start();
  }

  async cleanup() {
    await this.stop();
    if (this.db) {
      try {
        execFileSync("psql", [ADMIN_URL, "-qc", `DROP DATABASE IF EXISTS ${this.db} WITH (FORCE)`], { stdio: "pipe" });
      } catch (err) {
        process.stderr.write(`dropping ${this.db}: ${err.message}\n`);
      }
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A worker process (child-ledger-worker): resolves `done` with {code, signal, stdout, stderr}. */
export function startWorker(args, { env = {}, cwd } = {}) {
  const proc = spawn(process.execPath, [CLI, ...args], {
    stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env }, cwd,
  });
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (d) => { stdout += d; });
  proc.stderr.on("data", (d) => { stderr += d; });
  const done = new Promise((resolve) => proc.once("close", (code, signal) => resolve({ code, signal, stdout, stderr })));
  return { proc, done, output: () => ({ stdout, stderr }) };
}

/** A node script in a child process: resolves with its stdout parsed as JSON (last line). */
export function runScript(source, { env = {}, timeoutMs = 180_000 } = {}) {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, ["--input-type=module", "-e", source], {
      stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env }, cwd: here,
    });
    let out = "";
    let err = "";
    proc.stdout.on("data", (d) => { out += d; });
    proc.stderr.on("data", (d) => { err += d; });
    const timer = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
    proc.once("close", (code) => {
      clearTimeout(timer);
      if (code !== 0) return reject(new Error(`script exited ${code}: ${err.slice(-3000)}`));
      try {
        resolve(JSON.parse(out.trim().split("\n").pop()));
      } catch {
        reject(new Error(`script printed no JSON: ${out.slice(-1000)} ${err.slice(-1000)}`));
      }
    });
  });
}

/**
 * An HTTP proxy to `target` whose `fault(req)` may answer instead (return
 * {status, headers, body}) or let the request through (return undefined).
 */
export async function faultProxy(target, fault) {
  const t = new URL(target);
  const seen = [];
  const server = http.createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    const answer = fault(req);
    if (answer) {
      req.resume();
      res.writeHead(answer.status, { "content-type": "application/problem+json", ...answer.headers });
      res.end(JSON.stringify(answer.body ?? { type: "about:blank", title: "injected", status: answer.status, detail: "injected fault" }));
      return;
    }
    const upstream = http.request({
      host: t.hostname, port: t.port, method: req.method, path: req.url, headers: req.headers,
    }, (up) => {
      res.writeHead(up.statusCode, up.headers);
      up.pipe(res);
    });
    upstream.on("error", () => { res.destroy(); });
    req.pipe(upstream);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); }),
  };
}

/** Every result row of a parent, by the package's own streaming reader. */
export async function rowsOf(ledger, parentId, options) {
  const rows = [];
  for await (const row of ledger.results(parentId, options)) rows.push(row);
  return rows;
}

/** Polls `check` until it returns truthy (or throws after timeoutMs). */
export async function until(check, timeoutMs = 30_000, what = "condition") {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}
