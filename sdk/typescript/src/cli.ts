#!/usr/bin/env node
/**
 * child-ledger-worker ./handler.js --queue q [flags]: runs a handler module's
 * default (or `handler`) export as a Worker. Exit 0 on a graceful stop, 2 on
 * a problem answer (its text on stderr) or bad flags, 1 otherwise.
 */
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { Ledger } from "./client.js";
import { LedgerError, ProblemError } from "./errors.js";
import { Worker, stderrLogger, type Handler } from "./worker.js";

const USAGE = `usage: child-ledger-worker HANDLER_MODULE --queue QUEUE [options]

Runs HANDLER_MODULE's default export (or its \`handler\` export) on every
child claimed from QUEUE: a return value records \`processed\` with that result,
throw new Failed(reason) records \`failed\`, new Skipped(reason) \`skipped\`,
any other error releases the child for another attempt.

options:
  --queue NAME            queue to work (required)
  --url URL               service URL (default: LEDGER_URL or http://127.0.0.1:8080)
  --token TOKEN           bearer token (default: LEDGER_TOKEN)
  --concurrency N         handlers at once (default 8)
  --batch N               children per claim (default: concurrency, at most 1000)
  --lease-seconds N       lease per claim, extended every third (default 60)
  --wait-seconds N        long poll when nothing is claimable (default 10; 1 with --exit-when-empty)
  --grace-seconds N       on SIGTERM/SIGINT, time for handlers in flight (default 30)
  --name NAME             worker name (default node-<host>-<pid>)
  --exit-when-empty       exit 0 once nothing is claimable and nothing is in hand
  --verbose               log each step on stderr
  -h, --help              this text

Exit status: 0 stopped (SIGTERM/SIGINT, or empty with --exit-when-empty);
2 the service refused a claim (401/403/404/422…: its problem on stderr) or a bad flag.
Prints the worker's stats as one JSON line on stdout at exit.
`;

function fail(message: string): never {
  process.stderr.write(`child-ledger-worker: ${message}\n`);
  process.exit(2);
}

function int(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isFinite(n) || !/^-?\d+(\.\d+)?$/.test(value.trim())) fail(`--${name} takes a number, got ${JSON.stringify(value)}`);
  return n;
}

async function main(): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      allowPositionals: true,
      options: {
        queue: { type: "string" },
        url: { type: "string" },
        token: { type: "string" },
        concurrency: { type: "string" },
        batch: { type: "string" },
        "lease-seconds": { type: "string" },
        "wait-seconds": { type: "string" },
        "grace-seconds": { type: "string" },
        name: { type: "string" },
        "exit-when-empty": { type: "boolean", default: false },
        verbose: { type: "boolean", default: false },
        help: { type: "boolean", short: "h", default: false },
      },
    });
  } catch (err) {
    fail(`${err instanceof Error ? err.message : String(err)}\n\n${USAGE}`);
  }
  const { values: o, positionals } = parsed;
  if (o.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  if (positionals.length !== 1 || !o.queue) fail(`give one handler module and --queue\n\n${USAGE}`);

  const path = resolve(process.cwd(), positionals[0]!);
  let module: Record<string, unknown>;
  try {
    module = (await import(pathToFileURL(path).href)) as Record<string, unknown>;
  } catch (err) {
    fail(`cannot load ${path}: ${err instanceof Error ? err.message : String(err)}`);
  }
  const handler = (typeof module.default === "function" ? module.default : module.handler) as Handler | undefined;
  if (typeof handler !== "function") fail(`${path} exports no handler: export default a function, or export \`handler\``);

  let ledger: Ledger;
  try {
    ledger = new Ledger(o.url, { token: o.token });
  } catch (err) {
    fail(err instanceof Error ? err.message : String(err));
  }
  const worker = new Worker(ledger, o.queue, handler, {
    concurrency: int("concurrency", o.concurrency),
    batch: int("batch", o.batch),
    leaseSeconds: int("lease-seconds", o["lease-seconds"]),
    waitSeconds: int("wait-seconds", o["wait-seconds"]),
    graceSeconds: int("grace-seconds", o["grace-seconds"]),
    name: o.name,
    exitWhenEmpty: o["exit-when-empty"],
    logger: stderrLogger(o.verbose),
  });
  try {
    const stats = await worker.run();
    process.stdout.write(`${JSON.stringify({ worker: worker.name, ...stats })}\n`);
    return 0;
  } catch (err) {
    process.stdout.write(`${JSON.stringify({ worker: worker.name, ...worker.stats })}\n`);
    if (err instanceof ProblemError || err instanceof LedgerError) {
      process.stderr.write(`child-ledger-worker: ${err.message}\n`);
      return 2;
    }
    process.stderr.write(`child-ledger-worker: ${err instanceof Error ? err.stack : String(err)}\n`);
    return 1;
  }
}

main().then((code) => {
  process.exitCode = code;
  // Anything a handler module left open must not keep a stopped worker alive.
  setTimeout(() => process.exit(code), 200).unref();
}, (err) => {
  process.stderr.write(`child-ledger-worker: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
