//! Children on SQLite: written in bulk from one JSON array read by
//! `json_each`, compared with an append, and skipped by a cancel.

use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::Row;

use super::{NOW, SqliteTx};
use crate::ledger::{NewChild, ParentId};
use crate::store::backend::{ChildChunk, ChildWrites, Inserted, Settled};
use crate::store::{StoreError, StoreResult, sql};

/// Children as one compact JSON array of `[sequence, key, payload, skip]`, so a
/// whole chunk is written by one statement reading `json_each`.
fn children_json(children: &[NewChild]) -> String {
    let rows: Vec<(i64, Option<&str>, &serde_json::value::RawValue, Option<&str>)> = children
        .iter()
        .map(|c| (c.sequence, c.key.as_deref(), &*c.payload, c.skip.as_deref()))
        .collect();
    serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned())
}

#[async_trait]
impl ChildWrites for SqliteTx {
    async fn insert_children(&mut self, chunk: ChildChunk<'_>) -> StoreResult<Inserted> {
        // Each child read out of the JSON once (`j`): its skip reason is
        // named three times, and each `->>` parses the element again;
        // `jsonb_each` hands it over parsed (`json_each` as text, parsed
        // again by each `->`: about a third of the statement's time).
        const INSERT: &str = "WITH j AS MATERIALIZED ( \
                 SELECT value ->> 0 AS sequence, value ->> 1 AS key, value -> 2 AS payload, value ->> 3 AS skip \
                 FROM jsonb_each(?2)) \
             INSERT INTO child (parent_id, sequence, key, payload, state, reason, terminal_at, changed_at) \
             SELECT ?1, sequence, key, payload, CASE WHEN skip IS NULL THEN 'pending' ELSE 'skipped' END, skip, \
                 CASE WHEN skip IS NULL THEN NULL ELSE ?3 END, ?3 \
             FROM j WHERE true";
        // An append leaves stored sequences alone: the rows back say which
        // were written, and how many of those were skipped.
        static APPEND: LazyLock<String> =
            LazyLock::new(|| format!("{INSERT} ON CONFLICT (parent_id, sequence) DO NOTHING RETURNING state"));
        let sql = if chunk.idempotent { APPEND.as_str() } else { INSERT };
        let query = sqlx::query(sql)
            .bind(chunk.parent_id.as_str())
            .bind(children_json(chunk.children))
            .bind(self.time().to_owned());
        let insert_failed = |err| StoreError::from_child_insert(err, chunk.parent_id);
        if !chunk.idempotent {
            // Every child is written or the statement fails: nothing to read
            // back (a row per child back cost a fifth of a registration).
            let written = query.execute(&mut **self).await.map_err(insert_failed)?;
            return Ok(Inserted {
                rows: written.rows_affected(),
                skipped: chunk.children.iter().filter(|c| c.skip.is_some()).count() as i64,
            });
        }
        let rows = query.fetch_all(&mut **self).await.map_err(insert_failed)?;
        let mut skipped = 0;
        for row in &rows {
            skipped += i64::from(row.try_get::<&str, _>(0)? == "skipped");
        }
        Ok(Inserted {
            rows: rows.len() as u64,
            skipped,
        })
    }

    async fn differing_sequences(&mut self, parent_id: &ParentId, chunk: &[NewChild]) -> StoreResult<Vec<i64>> {
        Ok(sqlx::query_scalar(
            // CROSS JOIN keeps json_each as the outer loop: one primary-key
            // lookup per appended child, never a scan of the parent's children.
            "SELECT c.sequence FROM json_each(?2) j \
                 CROSS JOIN child c ON c.parent_id = ?1 AND c.sequence = j.value ->> 0 \
                 WHERE c.key IS NOT (j.value ->> 1) OR c.payload <> (j.value -> 2) \
                    OR c.reason IS NOT (j.value ->> 3) OR (c.state = 'skipped') <> ((j.value ->> 3) IS NOT NULL) \
                 ORDER BY c.sequence LIMIT 100",
        )
        .bind(parent_id.as_str())
        .bind(children_json(chunk))
        .fetch_all(&mut **self)
        .await?)
    }

    /// The settled children come back one row each: SQLite has no
    /// `UPDATE ... RETURNING` inside a counting query.
    async fn skip_open_children(&mut self, parent_id: &ParentId, reason: &str) -> StoreResult<Settled> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            let leased = sql::leased_row();
            let view = sql::ClaimView::of(&leased, &sql::holder(&super::SQLITE, "claim_id"));
            format!(
                "UPDATE child AS c SET state = 'skipped', reason = ?2, terminal_at = {NOW}, changed_at = {NOW}, \
                     settled_from = CASE WHEN {leased} THEN 'in_flight' ELSE c.state END, \
                     attempts = {attempts}, claim_id = {claim}, previous_claim_id = {previous}, available_at = NULL \
                 WHERE c.parent_id = ?1 AND c.state IN ('pending', 'held') AND NOT {quiet} \
                 RETURNING settled_from",
                attempts = view.attempts,
                claim = view.claim_id,
                previous = view.previous_claim_id,
                quiet = sql::quiet_row(&super::SQLITE)
            )
        });
        let from: Vec<String> = sqlx::query_scalar(SQL.as_str())
            .bind(parent_id.as_str())
            .bind(reason)
            .fetch_all(&mut **self)
            .await?;
        sqlx::query("DELETE FROM claim_lease WHERE parent_id = ?1")
            .bind(parent_id.as_str())
            .execute(&mut **self)
            .await?;
        let count = |state: &str| from.iter().filter(|s| *s == state).count() as i64;
        Ok(Settled {
            children: from.len() as i64,
            from_in_flight: count("in_flight"),
            from_held: count("held"),
        })
    }
}
