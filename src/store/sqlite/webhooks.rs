//! The webhook outbox on SQLite: the one statement that writes completion
//! events, run per completed parent in the transaction that completed it.

use std::sync::LazyLock;

use async_trait::async_trait;
use uuid::Uuid;

use super::{NOW, SqliteTx};
use crate::ledger::ParentId;
use crate::store::StoreResult;
use crate::store::backend::Outbox;

#[async_trait]
impl Outbox for SqliteTx {
    async fn enqueue_completed(&mut self, parents: &[ParentId]) -> StoreResult<u64> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "INSERT INTO webhook_event (event_id, parent_id, completed_at, url, next_attempt_at, created_at) \
                 SELECT ?2, p.parent_id, p.completed_at, p.webhook_url, {NOW}, {NOW} \
                 FROM parent p WHERE p.parent_id = ?1 AND p.completed_at IS NOT NULL AND p.webhook_url IS NOT NULL \
                 ON CONFLICT (parent_id, completed_at) DO NOTHING"
            )
        });
        let mut written = 0;
        for parent_id in parents {
            written += sqlx::query(SQL.as_str())
                .bind(parent_id.as_str())
                .bind(Uuid::new_v4().to_string())
                .execute(&mut **self)
                .await?
                .rows_affected();
        }
        Ok(written)
    }
}
