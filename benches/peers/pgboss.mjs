#!/usr/bin/env node
// Peer benchmark: drain N no-op jobs with pg-boss using its batch fast path:
// bulk `insert()`, then C concurrent loops of `fetch(name, { batchSize: 100 })`
// followed by one `complete(name, ids)` for the whole batch.
//
// Output: exactly one JSON line on stdout; logs on stderr. See README.md.
import { PgBoss } from "pg-boss";
import pg from "pg";
import { installedVersion, log, round, runBenchmark, seconds } from "./lib.mjs";

const PEER = "pg-boss";
const QUEUE = "noop";
const BATCH_SIZE = 100; // fetch() batchSize, completed with a single complete(name, ids)
const ENQUEUE_CHUNK = 10_000; // jobs per insert() call

await runBenchmark({
  scriptName: "pgboss.mjs",
  dbPrefix: "peer_pgboss",
  body: async ({ dbUrl, jobs: N, concurrency, onCleanup }) => {
    const version = installedVersion(PEER);
    const poolMax = concurrency + 2; // one connection per fetch loop, plus headroom
    log(`${PEER} ${version}: jobs=${N} concurrency=${concurrency} batchSize=${BATCH_SIZE}`);

    const boss = new PgBoss({
      connectionString: dbUrl,
      max: poolMax,
      // No cron/scheduling and no background maintenance/monitoring passes on
      // this instance (constructor options `schedule` / `supervise`): nothing
      // in this workload needs them, and they would only add periodic queries
      // to the timed window.
      schedule: false,
      supervise: false,
    });
    boss.on("error", (e) => log(`[pg-boss error] ${e?.stack ?? e}`));
    boss.on("warning", (w) => log(`[pg-boss warning] ${JSON.stringify(w)}`));
    await boss.start(); // installs the schema (migrate: true by default)
    let stopped = false;
    const stopBoss = async () => {
      if (stopped) return;
      stopped = true;
      await boss.stop({ graceful: false, close: true });
    };
    onCleanup(stopBoss);

    // v10+: a queue must exist before jobs can be sent to it.
    await boss.createQueue(QUEUE);

    const client = new pg.Client({ connectionString: dbUrl });
    await client.connect();
    onCleanup(() => client.end());
    const stateCounts = async () => {
      const { rows } = await client.query(
        "select state::text as state, count(*)::int as n from pgboss.job where name = $1 group by state",
        [QUEUE],
      );
      return Object.fromEntries(rows.map((r) => [r.state, r.n]));
    };

    // ---- enqueue (not part of the drain measurement) ----
    const t0 = process.hrtime.bigint();
    for (let done = 0; done < N; ) {
      const n = Math.min(ENQUEUE_CHUNK, N - done);
      await boss.insert(QUEUE, Array.from({ length: n }, () => ({ data: {} })));
      done += n;
    }
    const enqueueSeconds = seconds(t0, process.hrtime.bigint());
    const before = await stateCounts();
    if (before.created !== N || Object.keys(before).length !== 1) {
      throw new Error(`expected ${N} created jobs, found ${JSON.stringify(before)}`);
    }
    // The same settle step as child-ledger's side of the ratio: fresh
    // statistics, dead tuples vacuumed, dirty pages written back.
    await client.query("vacuum analyze");
    await client.query("checkpoint");
    log(`enqueued ${N} jobs in ${enqueueSeconds.toFixed(3)}s`);

    // ---- drain (measured) ----
    let claimed = 0;
    let completed = 0;
    let fetches = 0;
    let emptyFetches = 0;
    const drainLoop = async () => {
      for (;;) {
        const jobs = await boss.fetch(QUEUE, { batchSize: BATCH_SIZE });
        fetches += 1;
        if (jobs.length === 0) {
          // Every job is queued before the loops start: once all N have been
          // claimed, an empty fetch means this loop is done. Otherwise the
          // remaining rows were momentarily row-locked by another loop's fetch
          // (SKIP LOCKED), so try again shortly.
          if (claimed >= N) return;
          emptyFetches += 1;
          await new Promise((r) => setTimeout(r, 2));
          continue;
        }
        claimed += jobs.length;
        const ids = jobs.map((j) => j.id);
        // The job "work" is a no-op; complete the whole batch in one call.
        const res = await boss.complete(QUEUE, ids);
        if (res.affected !== ids.length) {
          throw new Error(`complete() affected ${res.affected} of ${ids.length} jobs`);
        }
        completed += ids.length;
      }
    };

    const tStart = process.hrtime.bigint();
    await Promise.all(Array.from({ length: concurrency }, drainLoop));
    const tEnd = process.hrtime.bigint();
    const drainSeconds = seconds(tStart, tEnd);
    log(
      `drained ${completed} jobs with ${fetches} fetches (${emptyFetches} empty retries) in ${drainSeconds.toFixed(3)}s`,
    );

    await stopBoss();
    const after = await stateCounts();
    if (completed !== N || after.completed !== N || Object.keys(after).length !== 1) {
      throw new Error(`drain incomplete: completed=${completed}, states=${JSON.stringify(after)}`);
    }

    return {
      peer: PEER,
      version,
      jobs: N,
      concurrency,
      enqueue_seconds: round(enqueueSeconds),
      drain_seconds: round(drainSeconds),
      jobs_per_second: round(N / drainSeconds, 1),
      settings:
        `${concurrency} concurrent loops of fetch(name, {batchSize: ${BATCH_SIZE}}) + complete(name, ids) per batch, ` +
        `pool max=${poolMax}, supervise=false, schedule=false, standard queue policy; ` +
        `enqueue via insert() in ${ENQUEUE_CHUNK}-job chunks`,
    };
  },
});
