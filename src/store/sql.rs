//! The ledger rules a statement must express in SQL, each next to the Rust
//! rule it mirrors (tested to agree on the same rows, below), and the column
//! lists and fragments that statements of both dialects are built from.

use std::sync::LazyLock;

use super::statement::Dialect;

/// `Tally::is_complete` in SQL: a parent completes when it is decomposed and
/// every child is terminal. `decomposed` is a boolean expression; `terminal`
/// and `total` are counts.
pub(crate) fn complete(decomposed: &str, terminal: &str, total: &str) -> String {
    format!("({decomposed} AND {terminal} >= {total})")
}

/// `Tolerance::crossed` in SQL: whether `failed` children of `total` are
/// more than a parent's stored tolerance (`count`, `percent`: its columns,
/// at most one set; neither: never crossed) tolerates.
pub(crate) fn crossed(count: &str, percent: &str, failed: &str, total: &str) -> String {
    format!(
        "(({count} IS NOT NULL AND {failed} > {count}) \
          OR ({count} IS NULL AND {percent} IS NOT NULL AND {failed} * 100.0 > {percent} * {total}))"
    )
}

/// `crossed` over a parent row aliased `alias`, for `failed` failed children.
pub(crate) fn parent_crossed(alias: &str, failed: &str) -> String {
    crossed(
        &format!("{alias}.tolerated_count"),
        &format!("{alias}.tolerated_percent"),
        failed,
        &format!("{alias}.total"),
    )
}

/// `complete` over a parent row's own stored projection, aliased `alias`.
pub(crate) fn parent_complete(alias: &str) -> String {
    complete(
        &format!("{alias}.decomposed_at IS NOT NULL"),
        &format!("{alias}.processed + {alias}.failed + {alias}.skipped"),
        &format!("{alias}.total"),
    )
}

/// A child's claim as readers see it, as SQL expressions over the row: its
/// attempts, its claim and the one before. The row counts only the attempts
/// that ended (`claim_id` made the last one, `previous_claim_id` the one
/// before); a live lease adds its own (see `child_view`).
pub(crate) struct ClaimView {
    pub attempts: String,
    pub claim_id: String,
    pub previous_claim_id: String,
}

impl ClaimView {
    /// The view of child row `c` that is in flight when `leased` holds, under
    /// the lease of claim `holder`.
    pub fn of(leased: &str, holder: &str) -> Self {
        Self {
            attempts: format!("(c.attempts + CASE WHEN {leased} THEN 1 ELSE 0 END)"),
            claim_id: format!("(CASE WHEN {leased} THEN {holder} ELSE c.claim_id END)"),
            previous_claim_id: format!("(CASE WHEN {leased} THEN c.claim_id ELSE c.previous_claim_id END)"),
        }
    }
}

/// Whether child row `c` is in flight: pending, not given back (no
/// `available_at`), and below `floor`, its lane's floor (NULL: every child
/// was taken), on a parent that `has_lane` (migration 0014).
pub(crate) fn leased(floor: &str, has_lane: &str) -> String {
    format!("(c.state = 'pending' AND c.available_at IS NULL AND {has_lane} AND coalesce(c.sequence < {floor}, true))")
}

/// `ledger::outcome::attempt_of` in SQL: the attempt a claim id names on a
/// child (its current claim, or the one before), else NULL.
pub(crate) fn attempt_of(claim: &str, v: &ClaimView) -> String {
    format!(
        "CASE WHEN {claim} = {} THEN {a} WHEN {claim} = {} THEN {a} - 1 END",
        v.claim_id,
        v.previous_claim_id,
        a = v.attempts
    )
}

/// `ledger::outcome::fence_admits` in SQL: whether a write with claim id
/// `claim` may record a child's outcome (no claim id, or the child's current
/// claim, or the one before). NULL counts as no.
pub(crate) fn fence_admits(claim: &str, v: &ClaimView) -> String {
    format!(
        "coalesce({claim} IS NULL OR {claim} = {} OR {claim} = {}, false)",
        v.claim_id, v.previous_claim_id
    )
}

/// `QueueScope::allows` in Postgres: whether parent `p`'s queue is
/// within the scope bound as JSON text `param` (`QueueScope::as_json`: NULL
/// for every queue).
pub(crate) fn within_postgres(param: &str) -> String {
    format!(
        "({param}::text IS NULL \
          OR p.queue IN (SELECT jsonb_array_elements_text({param}::jsonb -> 'exact')) \
          OR EXISTS (SELECT 1 FROM jsonb_array_elements_text({param}::jsonb -> 'prefixes') AS x(prefix) \
                     WHERE starts_with(p.queue, x.prefix)))"
    )
}

/// `within_postgres` in SQLite.
pub(crate) fn within_sqlite(param: &str) -> String {
    format!(
        "({param} IS NULL \
          OR p.queue IN (SELECT value FROM json_each({param}, '$.exact')) \
          OR EXISTS (SELECT 1 FROM json_each({param}, '$.prefixes') AS x \
                     WHERE substr(p.queue, 1, length(x.value)) = x.value))"
    )
}

/// `ledger::outcome::credited_attempt` in SQL: the attempt an outcome write
/// is credited to. A write without a claim id is credited to the current
/// attempt, if the child was ever claimed.
pub(crate) fn credited_attempt(claim: &str, v: &ClaimView) -> String {
    format!(
        "CASE WHEN {claim} IS NULL THEN NULLIF({}, 0) ELSE {} END",
        v.attempts,
        attempt_of(claim, v)
    )
}

/// A child's columns as `Child` reads them, from `CHILD_VIEW`: the row, and
/// the lease `h` that holds it while it is in flight.
pub(crate) const CHILD_COLUMNS: &str = "c.parent_id, c.sequence, c.key, \
    CASE WHEN h.claim_id IS NULL THEN c.state ELSE 'in_flight' END AS state, c.payload, \
    c.attempts + CASE WHEN h.claim_id IS NULL THEN 0 ELSE 1 END AS attempts, \
    coalesce(h.claim_id, c.claim_id) AS claim_id, \
    CASE WHEN h.claim_id IS NULL THEN c.claimed_by ELSE h.worker END AS claimed_by, \
    CASE WHEN h.claim_id IS NULL THEN c.lease_expires_at ELSE h.expires_at END AS lease_expires_at, \
    c.previous_attempt, c.available_at, c.not_before, c.reason, c.result, c.outcome_attempt, c.terminal_at, \
    CASE WHEN h.claim_id IS NULL THEN c.changed_at ELSE h.claimed_at END AS changed_at, \
    c.conflicts, c.conflict_count, c.redrive_of_parent, c.redrive_of_sequence";

/// The tables `CHILD_COLUMNS` reads, in dialect `d`: `child c`, its lane
/// `ln`, and its live lease `h` (none unless it is in flight), found by the
/// lease's range and then its list.
pub(crate) fn child_view(d: &Dialect) -> String {
    format!(
        "child c LEFT JOIN lane ln ON ln.parent_id = c.parent_id \
         LEFT JOIN claim_lease h ON {leased} AND h.parent_id = c.parent_id \
             AND h.lo <= c.sequence AND h.hi >= c.sequence AND {holds}",
        leased = leased("ln.floor", "ln.parent_id IS NOT NULL"),
        holds = (d.lease_holds)("h", "c.sequence")
    )
}

/// The claim of the lease that holds child row `c` (of a parent whose
/// lease rows are `claim_lease`), in dialect `d`; NULL when none does.
pub(crate) fn holder(d: &Dialect, column: &str) -> String {
    format!(
        "(SELECT l.{column} FROM claim_lease l WHERE l.parent_id = c.parent_id \
            AND l.lo <= c.sequence AND l.hi >= c.sequence AND {} LIMIT 1)",
        (d.lease_holds)("l", "c.sequence")
    )
}

/// Child row `c`'s claim as readers see it, for a statement that reads one
/// row of the child table (its lane and lease looked up).
pub(crate) fn conflict_view(d: &Dialect) -> ClaimView {
    let leased = leased(
        "(SELECT floor FROM lane WHERE lane.parent_id = c.parent_id)",
        "EXISTS (SELECT 1 FROM lane WHERE lane.parent_id = c.parent_id)",
    );
    ClaimView::of(&leased, &holder(d, "claim_id"))
}

/// A parent's open counts (`open_pending`, `open_in_flight`, `open_held`)
/// from its counters and its lane's, for `parent p LEFT JOIN lane l`: no count
/// over its children (migration 0009 says how each is kept).
pub(crate) static OPEN_COUNTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{OPEN_IN_FLIGHT} AS open_in_flight, {OPEN_HELD} AS open_held, {} AS open_pending",
        open_pending()
    )
});

/// A parent's children in flight, for `parent p LEFT JOIN lane l`.
pub(crate) const OPEN_IN_FLIGHT: &str = "(coalesce(l.claimed - l.unclaimed, 0) - p.settled_in_flight)";

/// A parent's held children, for `parent p LEFT JOIN lane l`.
pub(crate) const OPEN_HELD: &str = "(coalesce(l.held_in - l.held_out, 0) - p.settled_held)";

/// A parent's pending children, for `parent p LEFT JOIN lane l`.
pub(crate) fn open_pending() -> String {
    format!("(p.total - p.processed - p.failed - p.skipped - {OPEN_IN_FLIGHT} - {OPEN_HELD})")
}

/// A parent row's columns with its open counts.
pub(crate) static PARENT_SELECT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT p.parent_id, p.queue, p.payload, p.max_attempts, p.expired_lease, p.priority, p.webhook_url, \
             p.not_before, p.flow_key, p.backoff_initial, p.backoff_max, \
             p.total, p.processed, p.failed, p.skipped, p.created_at, p.decomposed_at, p.completed_at, \
             p.last_progress_at, p.position, p.tolerated_count, p.tolerated_percent, p.cancelled_at, p.redrive_of, \
             {open_counts} \
         FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id",
        open_counts = OPEN_COUNTS.as_str()
    )
});

/// Counts a statement's outcomes into a parent's minute buckets (migration
/// 0009): the assignments of an `UPDATE parent`, for columns prefixed `t`
/// (`"p."` or `""`), the dialect's current minute since the epoch `minute`,
/// and the counts to add. Every assignment reads the row as it was.
pub(crate) fn count_minute(t: &str, minute: &str, processed: &str, failed: &str) -> String {
    format!(
        "previous_minute_processed = CASE WHEN {t}minute = {minute} THEN {t}previous_minute_processed \
             WHEN {t}minute = {minute} - 1 THEN {t}minute_processed ELSE 0 END, \
         previous_minute_failed = CASE WHEN {t}minute = {minute} THEN {t}previous_minute_failed \
             WHEN {t}minute = {minute} - 1 THEN {t}minute_failed ELSE 0 END, \
         minute_processed = CASE WHEN {t}minute = {minute} THEN {t}minute_processed ELSE 0 END + {processed}, \
         minute_failed = CASE WHEN {t}minute = {minute} THEN {t}minute_failed ELSE 0 END + {failed}, \
         minute = {minute}"
    )
}

/// Returns a parent's held child `$2` (NULL: every held child) to pending,
/// given back (claimable now through its `available_at`, as a released
/// child is); `now` is the dialect's clock.
pub(crate) fn retry_held(now: &str) -> String {
    format!(
        "UPDATE child SET state = 'pending', available_at = {now}, changed_at = {now} \
         WHERE parent_id = $1 AND ($2 IS NULL OR sequence = $2) AND state = 'held'"
    )
}

/// Why each losing outcome write lost: for each `(parent_id, sequence)` of the
/// input, whether its parent is decomposed, the child's state (NULL when
/// missing) as readers see it, and whether the write passes the fence.
/// `input` is the dialect's table of `(i, parent_id, sequence, claim_id)`.
pub(crate) fn loser_facts(d: &Dialect, input: &str) -> String {
    let view = ClaimView::of("h.claim_id IS NOT NULL", "h.claim_id");
    format!(
        "SELECT u.i, p.decomposed_at IS NOT NULL, \
             CASE WHEN h.claim_id IS NULL THEN c.state ELSE 'in_flight' END, {fence} FROM {input} \
         LEFT JOIN parent p ON p.parent_id = u.parent_id \
         LEFT JOIN ({from}) ON c.parent_id = u.parent_id AND c.sequence = u.sequence",
        fence = fence_admits("u.claim_id", &view),
        from = child_view(d)
    )
}

/// The delay in seconds of a child handed out again after `attempts`
/// attempts ended (an expression), by parent `p`'s `retry_backoff`:
/// `RetryBackoff::ceiling` times `random` (the dialect's random fraction in
/// [0, 1): full jitter); 0 without a backoff.
pub(crate) fn backoff_seconds(random: &str, p: &str, attempts: &str) -> String {
    let ceiling = format!(
        "{p}.backoff_initial * (1 << (CASE WHEN {attempts} > 31 THEN 30 WHEN {attempts} < 1 THEN 0 \
             ELSE {attempts} - 1 END))"
    );
    format!("coalesce(CASE WHEN {ceiling} > {p}.backoff_max THEN {p}.backoff_max ELSE {ceiling} END * {random}, 0)")
}

#[cfg(test)]
mod tests {
    //! The SQL rules against their Rust mirrors, on the same rows, on SQLite
    //! and (when it answers, or always when it is required) on Postgres.

    use sqlx::{AssertSqlSafe, Connection};
    use uuid::Uuid;

    use super::*;
    use crate::ledger::outcome::{
        attempt_of as rust_attempt_of, credited_attempt as rust_credited, fence_admits as rust_fence,
    };
    use crate::ledger::projection::Tally;

    /// `(decomposed, total, processed, failed, skipped)`.
    fn tallies() -> Vec<(bool, i64, i64, i64, i64)> {
        let mut rows = Vec::new();
        for decomposed in [false, true] {
            for total in [0, 1, 3] {
                for (processed, failed, skipped) in [(0, 0, 0), (1, 0, 0), (1, 1, 0), (1, 1, 1), (2, 1, 1)] {
                    rows.push((decomposed, total, processed, failed, skipped));
                }
            }
        }
        rows
    }

    /// A stored child row's `(attempts, claim_id, previous_claim_id)` (the
    /// attempts that ended), the claim whose live lease holds it, if any,
    /// and a write's claim.
    type ClaimRow = (i32, Option<Uuid>, Option<Uuid>, Option<Uuid>, Option<Uuid>);

    fn claims() -> Vec<ClaimRow> {
        let (a, b, live, other) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let mut rows = Vec::new();
        for (attempts, current, previous) in [(0, None, None), (1, Some(a), None), (2, Some(b), Some(a))] {
            for holder in [None, Some(live)] {
                for write in [None, Some(a), Some(b), Some(live), Some(other)] {
                    rows.push((attempts, current, previous, holder, write));
                }
            }
        }
        rows
    }

    /// The child as readers see it (`CHILD_COLUMNS`): a live lease is its
    /// current attempt, and the last ended one becomes the one before.
    fn view((attempts, claim_id, previous, holder, _): ClaimRow) -> (i32, Option<Uuid>, Option<Uuid>) {
        match holder {
            Some(holder) => (attempts + 1, Some(holder), claim_id),
            None => (attempts, claim_id, previous),
        }
    }

    fn complete_sql(values: &str) -> String {
        format!(
            "WITH p(decomposed, total, processed, failed, skipped) AS (VALUES {values}) SELECT {} FROM p",
            complete("p.decomposed", "p.processed + p.failed + p.skipped", "p.total")
        )
    }

    fn expected_complete() -> Vec<bool> {
        tallies()
            .into_iter()
            .map(|(decomposed, total, processed, failed, skipped)| {
                Tally {
                    total,
                    processed,
                    failed,
                    skipped,
                }
                .is_complete(decomposed)
            })
            .collect()
    }

    /// `(count, percent, failed, total)`: every form of tolerance around its edges.
    fn tolerances() -> Vec<(Option<i64>, Option<f64>, i64, i64)> {
        let mut rows = Vec::new();
        for (count, percent) in [
            (None, None),
            (Some(0), None),
            (Some(2), None),
            (None, Some(0.0)),
            (None, Some(2.5)),
            (None, Some(10.0)),
            (None, Some(33.3)),
            (None, Some(100.0)),
        ] {
            for total in [0, 3, 10, 40, 1_000_000] {
                for failed in [0, 1, 2, 3, 4, 10, 333_000, 333_001] {
                    rows.push((count, percent, failed, total));
                }
            }
        }
        rows
    }

    fn crossed_sql(values: &str) -> String {
        format!(
            "WITH p(tolerated_count, tolerated_percent, failed, total) AS (VALUES {values}) SELECT {} FROM p",
            parent_crossed("p", "p.failed")
        )
    }

    fn expected_crossed() -> Vec<bool> {
        use crate::ledger::Tolerance;
        tolerances()
            .into_iter()
            .map(|(count, percent, failed, total)| {
                Tolerance::from_columns(count, percent).is_some_and(|t| t.crossed(failed, total))
            })
            .collect()
    }

    fn tolerance_values(cast_int: &str, cast_float: &str) -> String {
        tolerances()
            .into_iter()
            .map(|(count, percent, failed, total)| {
                format!(
                    "({}, {}, {failed}{cast_int}, {total}{cast_int})",
                    count.map_or(format!("NULL{cast_int}"), |c| format!("{c}{cast_int}")),
                    percent.map_or(format!("NULL{cast_float}"), |p| format!("{p:?}{cast_float}")),
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn expected_attempts() -> Vec<(Option<i32>, Option<i32>, bool)> {
        claims()
            .into_iter()
            .map(|row| {
                let ((attempts, current, previous), write) = (view(row), row.4);
                (
                    rust_attempt_of(attempts, current, previous, write),
                    rust_credited(attempts, current, previous, write),
                    rust_fence(current, previous, write),
                )
            })
            .collect()
    }

    fn attempts_sql(values: &str, claim: &str) -> String {
        let v = ClaimView::of("(c.h IS NOT NULL)", "c.h");
        format!(
            "WITH c(n, attempts, claim_id, previous_claim_id, h, w) AS (VALUES {values}) \
             SELECT {}, {}, {} FROM c ORDER BY c.n",
            attempt_of(claim, &v),
            credited_attempt(claim, &v),
            fence_admits(claim, &v)
        )
    }

    /// Queue scopes and queue names, and whether each scope reaches each name by the Rust rule.
    fn scopes() -> Vec<(Option<String>, Vec<bool>)> {
        let scopes = [
            vec!["*"],
            vec!["events"],
            vec!["team-a.*", "billing"],
            vec!["a*", "a.b"],
        ];
        scopes
            .iter()
            .map(|entries| {
                let entries: Vec<String> = entries.iter().map(|e| (*e).to_owned()).collect();
                let scope = crate::ledger::QueueScope::parse(&entries).unwrap();
                (scope.as_json(), QUEUES.iter().map(|q| scope.allows(q)).collect())
            })
            .collect()
    }

    const QUEUES: [&str; 7] = ["events", "events2", "team-a.x", "team-a", "billing", "a.b", "b"];

    fn within_sql(fragment: &str) -> String {
        let values: Vec<String> = QUEUES
            .iter()
            .enumerate()
            .map(|(i, q)| format!("({i}, '{q}')"))
            .collect();
        format!(
            "WITH p(n, queue) AS (VALUES {}) SELECT {fragment} FROM p ORDER BY p.n",
            values.join(", ")
        )
    }

    fn uuid_sql(id: Option<Uuid>, cast: &str) -> String {
        id.map_or_else(|| format!("NULL{cast}"), |id| format!("'{id}'{cast}"))
    }

    #[tokio::test]
    async fn rules_agree_with_rust_on_sqlite() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await.unwrap();
        let values: Vec<String> = tallies()
            .into_iter()
            .map(|(d, t, p, f, s)| format!("({}, {t}, {p}, {f}, {s})", i32::from(d)))
            .collect();
        let got: Vec<bool> = sqlx::query_scalar(AssertSqlSafe(complete_sql(&values.join(", "))))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(got, expected_complete());

        let got: Vec<bool> = sqlx::query_scalar(AssertSqlSafe(crossed_sql(&tolerance_values("", ""))))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(got, expected_crossed());

        let rows = claims();
        let claims_sql = rows
            .into_iter()
            .enumerate()
            .map(|(n, (attempts, current, previous, holder, write))| {
                format!(
                    "({n}, {attempts}, {}, {}, {}, {})",
                    uuid_sql(current, ""),
                    uuid_sql(previous, ""),
                    uuid_sql(holder, ""),
                    uuid_sql(write, "")
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let got: Vec<(Option<i32>, Option<i32>, bool)> =
            sqlx::query_as(AssertSqlSafe(attempts_sql(&claims_sql, "c.w")))
                .fetch_all(&mut conn)
                .await
                .unwrap();
        assert_eq!(got, expected_attempts());

        for (scope, expected) in scopes() {
            let got: Vec<bool> = sqlx::query_scalar(AssertSqlSafe(within_sql(&within_sqlite("$1"))))
                .bind(&scope)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            assert_eq!(got, expected, "{scope:?}");
        }
    }

    #[tokio::test]
    async fn rules_agree_with_rust_on_postgres() {
        let Some(url) = crate::store::test_postgres_url().await else {
            return;
        };
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let values: Vec<String> = tallies()
            .into_iter()
            .map(|(d, t, p, f, s)| format!("({d}, {t}::bigint, {p}::bigint, {f}::bigint, {s}::bigint)"))
            .collect();
        let got: Vec<bool> = sqlx::query_scalar(AssertSqlSafe(complete_sql(&values.join(", "))))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(got, expected_complete());

        let got: Vec<bool> = sqlx::query_scalar(AssertSqlSafe(crossed_sql(&tolerance_values("::bigint", "::float8"))))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(got, expected_crossed());

        let claims_sql = claims()
            .into_iter()
            .enumerate()
            .map(|(n, (attempts, current, previous, holder, write))| {
                format!(
                    "({n}, {attempts}, {}, {}, {}, {})",
                    uuid_sql(current, "::uuid"),
                    uuid_sql(previous, "::uuid"),
                    uuid_sql(holder, "::uuid"),
                    uuid_sql(write, "::uuid")
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let got: Vec<(Option<i32>, Option<i32>, bool)> =
            sqlx::query_as(AssertSqlSafe(attempts_sql(&claims_sql, "c.w")))
                .fetch_all(&mut conn)
                .await
                .unwrap();
        assert_eq!(got, expected_attempts());

        for (scope, expected) in scopes() {
            let got: Vec<bool> = sqlx::query_scalar(AssertSqlSafe(within_sql(&within_postgres("$1"))))
                .bind(&scope)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            assert_eq!(got, expected, "{scope:?}");
        }
    }
}
