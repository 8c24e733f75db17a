//! The ledger rules a statement must express in SQL, each next to the Rust
//! rule it mirrors (tested to agree on the same rows, below), and the column
//! lists and fragments that statements of both dialects are built from.

use std::sync::LazyLock;

/// `Tally::is_complete` in SQL: a parent completes when it is decomposed and
/// every child is terminal. `decomposed` is a boolean expression; `terminal`
/// and `total` are counts.
pub(crate) fn complete(decomposed: &str, terminal: &str, total: &str) -> String {
    format!("({decomposed} AND {terminal} >= {total})")
}

/// `complete` over a parent row's own stored projection, aliased `alias`.
pub(crate) fn parent_complete(alias: &str) -> String {
    complete(
        &format!("{alias}.decomposed_at IS NOT NULL"),
        &format!("{alias}.processed + {alias}.failed + {alias}.skipped"),
        &format!("{alias}.total"),
    )
}

/// `ledger::outcome::attempt_of` in SQL: the attempt a claim id names on child
/// row `c` (its current claim, or the one before), else NULL.
pub(crate) fn attempt_of(claim: &str) -> String {
    format!(
        "CASE WHEN {claim} = c.claim_id THEN c.attempts \
              WHEN {claim} = c.previous_claim_id THEN c.attempts - 1 END"
    )
}

/// `ledger::outcome::fence_admits` in SQL: whether a write with claim id
/// `claim` may record child row `c`'s outcome (no claim id, or the child's
/// current claim, or the one before). NULL counts as no.
pub(crate) fn fence_admits(claim: &str) -> String {
    format!("coalesce({claim} IS NULL OR {claim} = c.claim_id OR {claim} = c.previous_claim_id, false)")
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
/// is credited to on child row `c`. A write without a claim id is credited to
/// the current attempt, if the child was ever claimed.
pub(crate) fn credited_attempt(claim: &str) -> String {
    format!(
        "CASE WHEN {claim} IS NULL THEN NULLIF(c.attempts, 0) ELSE {} END",
        attempt_of(claim)
    )
}

/// A child row's columns as `Child` reads them.
pub(crate) const CHILD_COLUMNS: &str = "c.parent_id, c.sequence, c.key, c.state, c.payload, c.attempts, \
    c.claim_id, c.claimed_by, c.lease_expires_at, c.previous_attempt, c.available_at, c.reason, c.result, \
    c.outcome_attempt, c.terminal_at, c.changed_at, c.conflicts, c.conflict_count";

/// A parent's open counts (`open_pending`, `open_in_flight`, `open_held`)
/// from its counters and its lane's, for `parent p LEFT JOIN lane l`: no count
/// over its children (migration 0009 says how each is kept).
pub(crate) const OPEN_COUNTS: &str = "coalesce(l.claimed - l.unclaimed, 0) - p.settled_in_flight AS open_in_flight, \
     coalesce(l.held_in - l.held_out, 0) - p.settled_held AS open_held, \
     p.total - p.processed - p.failed - p.skipped \
         - (coalesce(l.claimed - l.unclaimed, 0) - p.settled_in_flight) \
         - (coalesce(l.held_in - l.held_out, 0) - p.settled_held) AS open_pending";

/// A parent row's columns with its open counts.
pub(crate) static PARENT_SELECT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT p.parent_id, p.queue, p.payload, p.max_attempts, p.expired_lease, p.priority, p.webhook_url, \
             p.total, p.processed, p.failed, p.skipped, p.created_at, p.decomposed_at, p.completed_at, \
             p.last_progress_at, p.position, {OPEN_COUNTS} \
         FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id"
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

/// Returns a held child to pending; `now` is the dialect's clock.
pub(crate) fn retry_held(now: &str) -> String {
    format!(
        "UPDATE child SET state = 'pending', available_at = NULL, changed_at = {now} \
         WHERE parent_id = $1 AND sequence = $2 AND state = 'held'"
    )
}

/// Why each losing outcome write lost: for each `(parent_id, sequence)` of the
/// input, whether its parent is decomposed and the child's state (NULL when
/// missing). `input` is the dialect's table of `(i, parent_id, sequence, claim_id)`.
pub(crate) fn loser_facts(input: &str) -> String {
    format!(
        "SELECT u.i, p.decomposed_at IS NOT NULL, c.state, {} FROM {input} \
         LEFT JOIN parent p ON p.parent_id = u.parent_id \
         LEFT JOIN child c ON c.parent_id = u.parent_id AND c.sequence = u.sequence",
        fence_admits("u.claim_id")
    )
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

    /// `(attempts, claim_id, previous_claim_id, write_claim)`.
    type ClaimRow = (i32, Option<Uuid>, Option<Uuid>, Option<Uuid>);

    fn claims() -> Vec<ClaimRow> {
        let (a, b, other) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let mut rows = Vec::new();
        for (attempts, current, previous) in [(0, None, None), (1, Some(a), None), (2, Some(b), Some(a))] {
            for write in [None, Some(a), Some(b), Some(other)] {
                rows.push((attempts, current, previous, write));
            }
        }
        rows
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

    fn expected_attempts() -> Vec<(Option<i32>, Option<i32>, bool)> {
        claims()
            .into_iter()
            .map(|(attempts, current, previous, write)| {
                (
                    rust_attempt_of(attempts, current, previous, write),
                    rust_credited(attempts, current, previous, write),
                    rust_fence(current, previous, write),
                )
            })
            .collect()
    }

    fn attempts_sql(values: &str, claim: &str) -> String {
        format!(
            "WITH c(n, attempts, claim_id, previous_claim_id, w) AS (VALUES {values}) \
             SELECT {}, {}, {} FROM c ORDER BY c.n",
            attempt_of(claim),
            credited_attempt(claim),
            fence_admits(claim)
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

        let rows = claims();
        let claims_sql = rows
            .into_iter()
            .enumerate()
            .map(|(n, (attempts, current, previous, write))| {
                format!(
                    "({n}, {attempts}, {}, {}, {})",
                    uuid_sql(current, ""),
                    uuid_sql(previous, ""),
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

        let claims_sql = claims()
            .into_iter()
            .enumerate()
            .map(|(n, (attempts, current, previous, write))| {
                format!(
                    "({n}, {attempts}, {}, {}, {})",
                    uuid_sql(current, "::uuid"),
                    uuid_sql(previous, "::uuid"),
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
