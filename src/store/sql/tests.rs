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

/// The child as readers see it (`child_columns`): a live lease is its
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

/// The rule over `failed` written as a difference, as the Postgres outcome
/// statement asks it of the count before its own failures (`p.failed -
/// d.failed`): the whole difference is what is compared.
fn crossed_sql(values: &str) -> String {
    format!(
        "WITH p(tolerated_count, tolerated_percent, failed, total) AS (VALUES {values}) SELECT {} FROM p",
        parent_crossed("p", "p.failed + 1 - 1")
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
    let got: Vec<(Option<i32>, Option<i32>, bool)> = sqlx::query_as(AssertSqlSafe(attempts_sql(&claims_sql, "c.w")))
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
    let got: Vec<(Option<i32>, Option<i32>, bool)> = sqlx::query_as(AssertSqlSafe(attempts_sql(&claims_sql, "c.w")))
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
