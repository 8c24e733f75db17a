#!/usr/bin/env node
// Peer benchmark: drain N no-op jobs with graphile-worker using its documented
// high-throughput configuration (worker.graphile.org/docs/performance,
// "Batching": localQueue + completeJobBatchDelay/failJobBatchDelay).
//
// Output: exactly one JSON line on stdout; logs on stderr. See README.md.
import pg from "pg";
import { installedVersion, log, round, runBenchmark, seconds, waitFor } from "./lib.mjs";

// graphile-worker logs one "Completed task ..." info line per job unless
// NO_LOG_SUCCESS is set; its own perfTest (perfTest/run.js) sets it, and so do
// we. It is read at module load, hence the dynamic import below.
process.env.NO_LOG_SUCCESS ??= "1";
const { Logger, run, runMigrations } = await import("graphile-worker");

const PEER = "graphile-worker";
const TASK = "noop";
// docs/performance "Quick stats" configuration; the cost bench also runs 100
// (GRAPHILE_LOCAL_QUEUE) beside claims of 100.
const LOCAL_QUEUE_SIZE = Number(process.env.GRAPHILE_LOCAL_QUEUE ?? 500);
const COMPLETE_JOB_BATCH_DELAY_MS = 0; // idem
const FAIL_JOB_BATCH_DELAY_MS = 0; // idem
const POLL_INTERVAL_MS = 100; // only matters when idle; local queue refetches immediately while batches are full
const ENQUEUE_CHUNK = 10_000; // jobs per graphile_worker.add_jobs() call

// Route graphile-worker's logging to stderr (its default console logger would
// use stdout, which is reserved for the result line). Debug is dropped.
const logger = new Logger((scope) => (level, message) => {
  if (level === "debug") return;
  const where = scope?.label ? `${scope.label}: ` : "";
  log(`[graphile-worker ${level}] ${where}${message}`);
});

await runBenchmark({
  scriptName: "graphile.mjs",
  dbPrefix: "peer_graphile",
  body: async ({ dbUrl, jobs: N, concurrency, onCleanup }) => {
    const version = installedVersion(PEER);
    const localQueueSize = Math.max(LOCAL_QUEUE_SIZE, concurrency);
    const maxPoolSize = Math.max(10, concurrency + 2); // WorkerOptions.maxPoolSize doc recommendation
    const preset = {
      worker: {
        connectionString: dbUrl,
        concurrentJobs: concurrency,
        maxPoolSize,
        pollInterval: POLL_INTERVAL_MS,
        preparedStatements: true,
        localQueue: { size: localQueueSize },
        completeJobBatchDelay: COMPLETE_JOB_BATCH_DELAY_MS,
        failJobBatchDelay: FAIL_JOB_BATCH_DELAY_MS,
        logger,
      },
    };
    log(`${PEER} ${version}: jobs=${N} concurrency=${concurrency} localQueue.size=${localQueueSize}`);

    // Install the schema up front so the timed window contains no migration work.
    await runMigrations({ preset });

    const client = new pg.Client({ connectionString: dbUrl });
    await client.connect();
    onCleanup(() => client.end());

    // ---- enqueue (not part of the drain measurement) ----
    // graphile_worker.add_jobs(job_spec[]) is the documented bulk-add function
    // (docs "Adding jobs through SQL" / library "addJobs()": the JS addJobs()
    // defers to it). Building the spec array server-side avoids shipping N
    // JSON specs and N returned rows through node.
    const t0 = process.hrtime.bigint();
    for (let done = 0; done < N; ) {
      const n = Math.min(ENQUEUE_CHUNK, N - done);
      const { rows } = await client.query(
        `select count(*)::int as added
           from graphile_worker.add_jobs(array(
             select row($1::text, '{}'::json, null, null, null, null, null, null)::graphile_worker.job_spec
               from generate_series(1, $2::int)
           ))`,
        [TASK, n],
      );
      if (rows[0].added !== n) throw new Error(`add_jobs added ${rows[0].added}, expected ${n}`);
      done += n;
    }
    const enqueueSeconds = seconds(t0, process.hrtime.bigint());
    const countJobs = async () =>
      (await client.query("select count(*)::int as n from graphile_worker._private_jobs")).rows[0].n;
    const queued = await countJobs();
    if (queued !== N) throw new Error(`expected ${N} queued jobs, found ${queued}`);
    // The same settle step as child-ledger's side of the ratio: fresh
    // statistics, dead tuples vacuumed, dirty pages written back.
    await client.query("vacuum analyze");
    await client.query("checkpoint");
    log(`enqueued ${N} jobs in ${enqueueSeconds.toFixed(3)}s`);

    // ---- drain (measured) ----
    let handled = 0;
    let resolveAllHandled;
    let rejectRun;
    const allHandled = new Promise((resolve, reject) => {
      resolveAllHandled = resolve;
      rejectRun = reject;
    });
    const taskList = {
      [TASK]: async () => {
        handled += 1;
        if (handled === N) resolveAllHandled();
      },
    };

    const tStart = process.hrtime.bigint();
    // `parsedCronItems: []` = no cron (skips looking for a ./crontab file).
    const runner = await run({ preset, taskList, parsedCronItems: [], noHandleSignals: true });
    let stopped = false;
    const stopRunner = async () => {
      if (stopped) return;
      stopped = true;
      await runner.stop();
    };
    onCleanup(stopRunner);
    runner.events.on("job:error", ({ error }) => rejectRun(new Error(`job failed: ${error?.stack ?? error}`)));
    runner.promise.then(
      () => rejectRun(new Error("worker stopped before all jobs were handled")),
      (e) => rejectRun(e),
    );

    await allHandled;
    const tHandled = process.hrtime.bigint();
    // A job is "done" when its row is gone; completions are batched, so wait
    // for the last batch to land before stopping the clock.
    await waitFor(async () => (await countJobs()) === 0, 5);
    const tEnd = process.hrtime.bigint();
    const drainSeconds = seconds(tStart, tEnd);
    log(
      `all ${N} handlers ran after ${seconds(tStart, tHandled).toFixed(3)}s; ` +
        `jobs table empty after ${drainSeconds.toFixed(3)}s`,
    );

    await stopRunner();
    // The cost bench counts the buffers the run dirtied: written back before
    // the database is dropped (which would discard them unwritten).
    if (process.env.GRAPHILE_CHECKPOINT_AFTER) await client.query("checkpoint");
    // The jobs table's write counts (HOT updates among them), once the
    // workers' connections have closed and flushed their statistics.
    await new Promise((r) => setTimeout(r, 1500));
    const stats = (
      await client.query(
        `select coalesce(sum(n_tup_ins), 0)::bigint as inserts, coalesce(sum(n_tup_upd), 0)::bigint as updates,
                coalesce(sum(n_tup_hot_upd), 0)::bigint as hot_updates, coalesce(sum(n_tup_del), 0)::bigint as deletes
           from pg_stat_user_tables where schemaname = 'graphile_worker'`,
      )
    ).rows[0];
    const remaining = await countJobs();
    if (remaining !== 0) throw new Error(`${remaining} jobs left in graphile_worker._private_jobs`);
    if (handled !== N) throw new Error(`handler ran ${handled} times for ${N} jobs`);

    return {
      peer: PEER,
      version,
      jobs: N,
      concurrency,
      enqueue_seconds: round(enqueueSeconds),
      drain_seconds: round(drainSeconds),
      jobs_per_second: round(N / drainSeconds, 1),
      table_stats: Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, Number(v)])),
      settings:
        `concurrentJobs=${concurrency}, localQueue.size=${localQueueSize}, ` +
        `completeJobBatchDelay=${COMPLETE_JOB_BATCH_DELAY_MS}, failJobBatchDelay=${FAIL_JOB_BATCH_DELAY_MS}, ` +
        `pollInterval=${POLL_INTERVAL_MS}ms, preparedStatements=true, maxPoolSize=${maxPoolSize}; ` +
        `enqueue via SQL graphile_worker.add_jobs in ${ENQUEUE_CHUNK}-job chunks`,
    };
  },
});
