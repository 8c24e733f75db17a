// Shared plumbing for the peer benchmarks: CLI parsing, stderr logging,
// scratch-database lifecycle, installed-version lookup, hard timeout and the
// single JSON result line on stdout.
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import pg from "pg";

export const DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres";

/** Everything human-readable goes to stderr; stdout carries only the result line. */
export function log(...args) {
  const ts = new Date().toISOString();
  console.error(`[${ts}]`, ...args);
}

function positiveInt(name, raw) {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) {
    throw new Error(`--${name} must be a positive integer, got ${JSON.stringify(raw)}`);
  }
  return n;
}

export function parseCli(scriptName) {
  const { values } = parseArgs({
    options: {
      "database-url": { type: "string", default: DEFAULT_DATABASE_URL },
      jobs: { type: "string", default: "200000" },
      concurrency: { type: "string", default: "8" },
      "timeout-seconds": { type: "string", default: "1200" },
      help: { type: "boolean", short: "h", default: false },
    },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) {
    console.error(
      `usage: node ${scriptName} [--database-url URL] [--jobs N] [--concurrency C] [--timeout-seconds S]\n` +
        `  --database-url     admin connection URL; a scratch database is created next to it\n` +
        `                     (default ${DEFAULT_DATABASE_URL})\n` +
        `  --jobs             number of no-op jobs to enqueue and drain (default 200000)\n` +
        `  --concurrency      total worker concurrency (default 8)\n` +
        `  --timeout-seconds  hard wall-clock limit for the whole run (default 1200)`,
    );
    process.exit(0);
  }
  return {
    databaseUrl: values["database-url"],
    jobs: positiveInt("jobs", values.jobs),
    concurrency: positiveInt("concurrency", values.concurrency),
    timeoutSeconds: positiveInt("timeout-seconds", values["timeout-seconds"]),
  };
}

/** Version of an installed dependency, read from its own package.json. */
export function installedVersion(pkgName) {
  // Packages may restrict `pkg/package.json` via "exports", so resolve the
  // entry point and walk up to the package root instead.
  let dir = dirname(fileURLToPath(import.meta.resolve(pkgName)));
  for (;;) {
    const candidate = join(dir, "package.json");
    if (existsSync(candidate)) {
      const pkg = JSON.parse(readFileSync(candidate, "utf8"));
      if (pkg.name === pkgName) return pkg.version;
    }
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`cannot find package.json for ${pkgName}`);
    dir = parent;
  }
}

function quoteIdent(name) {
  return `"${name.replace(/"/g, '""')}"`;
}

/**
 * Creates a uniquely named scratch database through the admin URL and returns
 * its URL plus an idempotent `drop()`.
 */
export async function createScratchDatabase(adminUrl, prefix) {
  const name = `${prefix}_${randomBytes(6).toString("hex")}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${quoteIdent(name)}`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${encodeURIComponent(name)}`;
  log(`created scratch database ${name}`);

  let dropped = null;
  const drop = () => {
    dropped ??= (async () => {
      const c = new pg.Client({ connectionString: adminUrl });
      await c.connect();
      try {
        try {
          // PG13+: terminates any connection still attached.
          await c.query(`DROP DATABASE IF EXISTS ${quoteIdent(name)} WITH (FORCE)`);
        } catch (e) {
          if (e.code !== "42601") throw e; // syntax error => pre-13 server
          await c.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            [name],
          );
          await c.query(`DROP DATABASE IF EXISTS ${quoteIdent(name)}`);
        }
        log(`dropped scratch database ${name}`);
      } finally {
        await c.end();
      }
    })();
    return dropped;
  };
  return { name, url: url.toString(), drop };
}

/**
 * Runs `body` inside a scratch database with a hard timeout. `body` receives
 * `{ dbUrl, dbName, onCleanup }` and must resolve to the result object, which
 * is printed as the one JSON line on stdout. Any failure, signal or timeout
 * drops the database and exits non-zero.
 */
export async function runBenchmark({ scriptName, dbPrefix, body }) {
  let opts;
  try {
    opts = parseCli(scriptName);
  } catch (e) {
    log(`argument error: ${e.message}`);
    process.exit(2);
  }

  const cleanups = [];
  let scratch = null;
  let finishing = false;

  const cleanupAll = async () => {
    // Library shutdown first (closes pools), then the database.
    for (const fn of cleanups.splice(0).reverse()) {
      try {
        await fn();
      } catch (e) {
        log(`cleanup step failed: ${e?.stack ?? e}`);
      }
    }
    if (scratch) {
      try {
        await scratch.drop();
      } catch (e) {
        log(`could not drop scratch database ${scratch.name}: ${e?.stack ?? e}`);
      }
    }
  };

  const abort = (why, code) => {
    if (finishing) return;
    finishing = true;
    log(`ABORT: ${why}`);
    // Never hang in cleanup: give it 30 s at most.
    setTimeout(() => process.exit(code), 30_000).unref();
    cleanupAll().finally(() => process.exit(code));
  };

  const hardTimer = setTimeout(
    () => abort(`hard timeout of ${opts.timeoutSeconds}s reached`, 124),
    opts.timeoutSeconds * 1000,
  );
  process.once("SIGINT", () => abort("SIGINT", 130));
  process.once("SIGTERM", () => abort("SIGTERM", 143));
  process.on("unhandledRejection", (e) => abort(`unhandled rejection: ${e?.stack ?? e}`, 1));
  process.on("uncaughtException", (e) => abort(`uncaught exception: ${e?.stack ?? e}`, 1));

  try {
    scratch = await createScratchDatabase(opts.databaseUrl, dbPrefix);
    const result = await body({
      ...opts,
      dbUrl: scratch.url,
      dbName: scratch.name,
      onCleanup: (fn) => cleanups.push(fn),
    });
    if (finishing) return;
    finishing = true;
    await cleanupAll();
    clearTimeout(hardTimer);
    process.stdout.write(JSON.stringify(result) + "\n", () => process.exit(0));
  } catch (e) {
    abort(`benchmark failed: ${e?.stack ?? e}`, 1);
  }
}

/** Poll `check()` every `intervalMs` until it returns true. */
export async function waitFor(check, intervalMs = 5) {
  for (;;) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

export const seconds = (startNs, endNs) => Number(endNs - startNs) / 1e9;
export const round = (x, digits = 4) => Number(x.toFixed(digits));
