//! Trace context kept with a registration (migration 0015 on Postgres,
//! 0014 on SQLite): the parent's `traceparent` (sequence -1) and each
//! child's that was given one, written with the registration or append,
//! deleted with the parent. The lane carries the parent's own and whether
//! children have theirs (migration 0016 on Postgres, 0015 on SQLite): the
//! claim statements hand them out from it.

use super::backend::Transaction;
use super::statement::{Sql, Statement};
use super::{Store, StoreResult, WRITE_CHUNK};
use crate::ledger::{NewChild, ParentId};

/// The sequence under which a parent's own trace context is kept.
const PARENT: i64 = -1;

/// Writes `$2`, a JSON array of `[sequence, traceparent]`, for parent `$1`;
/// what is already kept stays (an append's retried page).
static KEEP: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO trace_context (parent_id, sequence, traceparent) SELECT $1, x.n, x.t FROM ({}) AS x WHERE true \
         ON CONFLICT (parent_id, sequence) DO NOTHING",
        (d.json_pairs)("$2")
    )
});

/// Keeps the trace contexts of a registration (`parent`) or append (`None`)
/// in its transaction: one statement per chunk of children that have one.
pub(super) async fn keep(
    tx: &mut dyn Transaction,
    store: &Store,
    parent_id: &ParentId,
    parent: Option<&str>,
    children: &[NewChild],
) -> StoreResult<()> {
    let mut pairs: Vec<(i64, &str)> = Vec::new();
    if let Some(parent) = parent {
        pairs.push((PARENT, parent));
    }
    pairs.extend(
        children
            .iter()
            .filter_map(|c| c.traceparent.as_deref().map(|t| (c.sequence, t))),
    );
    for chunk in pairs.chunks(WRITE_CHUNK) {
        let json = serde_json::to_string(chunk).expect("pairs serialize");
        tx.execute(
            Statement::new(store.sql(&KEEP))
                .text(parent_id.as_str())
                .text(json.as_str()),
        )
        .await?;
    }
    Ok(())
}
