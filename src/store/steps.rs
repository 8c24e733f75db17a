//! Steps both backends run with the same SQL (`store::sql`), the same binds
//! and the same decoding, written once here and stamped into each backend's
//! module for its own database, pool and transaction types.

/// Reads of parents and children, as `impl` methods of a backend store:
/// `shared_reads!(PgStore, sqlx::Postgres, pool, "now()", sql::within_postgres, rows::time_param)`
/// reads through `self.pool` (a scan through `self.read()`, whose statement
/// ends if its request is dropped), with `now()` as the clock, the dialect's
/// queue-scope fragment and its way to bind a time. sqlx sends each bound
/// value's type, so the same `$N` text needs no casts on Postgres.
macro_rules! shared_reads {
    ($store:ty, $db:ty, $pool:ident, $now:expr, $within:path, $time:path) => {
        impl $store {
            /// Up to `fetch` parents matching `filter`, with their list positions.
            pub async fn list_parents(
                &self,
                filter: &$crate::store::ParentFilter,
                fetch: i64,
            ) -> $crate::store::StoreResult<Vec<(i64, $crate::ledger::Parent)>> {
                use sqlx::Row;
                fn sql(after: &str, order: &str) -> String {
                    format!(
                        "{select} \
                         WHERE ($1 IS NULL OR p.queue = $1) \
                           AND ($2 IS NULL \
                                OR ($2 = 'decomposing' AND p.decomposed_at IS NULL) \
                                OR ($2 = 'active' AND p.decomposed_at IS NOT NULL AND p.completed_at IS NULL) \
                                OR ($2 = 'complete' AND p.completed_at IS NOT NULL)) \
                           AND ($3 IS NULL OR p.position {after} $3) \
                           AND (NOT $4 OR (p.decomposed_at IS NOT NULL AND p.completed_at IS NULL AND EXISTS ( \
                                SELECT 1 FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'pending' \
                                  AND (c.available_at IS NULL OR c.available_at <= {now})))) \
                           AND {within} \
                           AND ($7 IS NULL \
                                OR ($7 = 'failed' AND p.failed > 0) \
                                OR ($7 = 'held' AND EXISTS ( \
                                    SELECT 1 FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'held')) \
                                OR ($7 = 'conflicts' AND EXISTS ( \
                                    SELECT 1 FROM child c WHERE c.parent_id = p.parent_id AND c.conflict_count > 0))) \
                           AND ($8 IS NULL OR p.created_at > $8) \
                           AND ($9 IS NULL OR p.created_at < $9) \
                         ORDER BY p.position {order} LIMIT $5",
                        select = $crate::store::sql::PARENT_SELECT,
                        now = $now,
                        within = $within("$6")
                    )
                }
                static OLDEST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| sql(">", "ASC"));
                static NEWEST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| sql("<", "DESC"));
                let statement = if filter.newest { &NEWEST } else { &OLDEST };
                let mut conn = self.read().await?;
                let rows = sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
                    .bind(filter.queue.as_ref().map($crate::ledger::QueueName::as_str))
                    .bind(filter.state.map(|s| s.as_str()))
                    .bind(filter.after_position)
                    .bind(filter.resumable)
                    .bind(fetch)
                    .bind(filter.within.as_json())
                    .bind(filter.has.map(|h| h.as_str()))
                    .bind(filter.created_after.map($time))
                    .bind(filter.created_before.map($time))
                    .fetch_all(&mut *conn)
                    .await?;
                conn.finish().await?;
                Ok(rows
                    .iter()
                    .map(|row| Ok((row.try_get::<i64, _>("position")?, rows::parent(row, false)?)))
                    .collect::<Result<_, sqlx::Error>>()?)
            }

            /// Up to `fetch` children of a parent after sequence `after`, in
            /// sequence order, optionally in one state.
            pub async fn children(
                &self,
                parent_id: &$crate::ledger::ParentId,
                state: Option<$crate::ledger::ChildState>,
                after: Option<i64>,
                fetch: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::ledger::Child>> {
                static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                    format!(
                        "SELECT {} FROM child c \
                         WHERE c.parent_id = $1 AND ($2 IS NULL OR c.state = $2) AND ($3 IS NULL OR c.sequence > $3) \
                         ORDER BY c.sequence LIMIT $4",
                        $crate::store::sql::CHILD_COLUMNS
                    )
                });
                let mut conn = self.read().await?;
                let rows = sqlx::query(sqlx::AssertSqlSafe(SQL.as_str()))
                    .bind(parent_id.as_str())
                    .bind(state.map($crate::ledger::ChildState::as_str))
                    .bind(after)
                    .bind(fetch)
                    .fetch_all(&mut *conn)
                    .await?;
                conn.finish().await?;
                Ok(rows.iter().map(rows::child).collect::<Result<Vec<_>, _>>()?)
            }

            /// Up to `filter.limit` children across parents, newest change
            /// first. The state is written into the statement (it is one of
            /// six words), so that Postgres, which plans statements once per
            /// connection, can use the index of failed and held children.
            pub async fn search_children(
                &self,
                filter: &$crate::store::ChildFilter,
            ) -> $crate::store::StoreResult<Vec<$crate::ledger::Child>> {
                let state = match filter.state {
                    Some(state) => format!("c.state = '{}'", state.as_str()),
                    None => "true".to_owned(),
                };
                let sql = format!(
                    "SELECT {columns} FROM child c JOIN parent p ON p.parent_id = c.parent_id \
                     WHERE {state} AND ($1 IS NULL OR c.parent_id = $1) AND ($2 IS NULL OR p.queue = $2) \
                       AND {within} \
                       AND ($4 IS NULL OR (c.changed_at, c.parent_id, c.sequence) < ($4, $5, $6)) \
                     ORDER BY c.changed_at DESC, c.parent_id DESC, c.sequence DESC LIMIT $7",
                    columns = $crate::store::sql::CHILD_COLUMNS,
                    within = $within("$3")
                );
                let (after_time, after_parent, after_sequence) = match &filter.after {
                    Some((time, parent_id, sequence)) => (Some($time(*time)), Some(parent_id.as_str()), Some(*sequence)),
                    None => (None, None, None),
                };
                let mut conn = self.read().await?;
                let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(filter.parent_id.as_ref().map($crate::ledger::ParentId::as_str))
                    .bind(filter.queue.as_ref().map($crate::ledger::QueueName::as_str))
                    .bind(filter.within.as_json())
                    .bind(after_time)
                    .bind(after_parent)
                    .bind(after_sequence)
                    .bind(filter.limit)
                    .fetch_all(&mut *conn)
                    .await?;
                conn.finish().await?;
                Ok(rows.iter().map(rows::child).collect::<Result<Vec<_>, _>>()?)
            }

            pub async fn parent(
                &self,
                parent_id: &$crate::ledger::ParentId,
                include_payload: bool,
            ) -> $crate::store::StoreResult<Option<$crate::ledger::Parent>> {
                let mut conn = self.read().await?;
                let row = sqlx::query(sqlx::AssertSqlSafe($crate::store::sql::PARENT_BY_ID.as_str()))
                    .bind(parent_id.as_str())
                    .fetch_optional(&mut *conn)
                    .await?;
                conn.finish().await?;
                Ok(row.map(|row| rows::parent(&row, include_payload)).transpose()?)
            }

            /// The registration fingerprint of a parent, if it exists.
            pub async fn fingerprint(
                &self,
                parent_id: &$crate::ledger::ParentId,
            ) -> $crate::store::StoreResult<Option<String>> {
                Ok(sqlx::query_scalar($crate::store::sql::PARENT_FINGERPRINT)
                    .bind(parent_id.as_str())
                    .fetch_optional(&self.$pool)
                    .await?)
            }

            /// A decomposed parent's largest payload in bytes: `None` when
            /// it has no lane (not decomposed), `Some(None)` when not on record.
            pub async fn lane_child_bytes(
                &self,
                parent_id: &$crate::ledger::ParentId,
            ) -> $crate::store::StoreResult<Option<Option<i32>>> {
                Ok(sqlx::query_scalar($crate::store::sql::LANE_CHILD_BYTES)
                    .bind(parent_id.as_str())
                    .fetch_optional(&self.$pool)
                    .await?)
            }

            /// The queue of a parent, if it exists.
            pub async fn queue_of(
                &self,
                parent_id: &$crate::ledger::ParentId,
            ) -> $crate::store::StoreResult<Option<String>> {
                Ok(sqlx::query_scalar($crate::store::sql::PARENT_QUEUE)
                    .bind(parent_id.as_str())
                    .fetch_optional(&self.$pool)
                    .await?)
            }

            pub async fn parent_exists(
                &self,
                parent_id: &$crate::ledger::ParentId,
            ) -> $crate::store::StoreResult<bool> {
                let found: Option<i32> = sqlx::query_scalar($crate::store::sql::PARENT_EXISTS)
                    .bind(parent_id.as_str())
                    .fetch_optional(&self.$pool)
                    .await?;
                Ok(found.is_some())
            }

            pub async fn child(
                &self,
                parent_id: &$crate::ledger::ParentId,
                sequence: i64,
            ) -> $crate::store::StoreResult<Option<$crate::ledger::Child>> {
                child_in(&self.$pool, parent_id, sequence).await
            }
        }

        /// One child, read through `executor` (a pool or a transaction).
        pub(super) async fn child_in<'e>(
            executor: impl sqlx::Executor<'e, Database = $db>,
            parent_id: &$crate::ledger::ParentId,
            sequence: i64,
        ) -> $crate::store::StoreResult<Option<$crate::ledger::Child>> {
            let row = sqlx::query(sqlx::AssertSqlSafe($crate::store::sql::CHILD_BY_KEY.as_str()))
                .bind(parent_id.as_str())
                .bind(sequence)
                .fetch_optional(executor)
                .await?;
            Ok(row.map(|row| rows::child(&row)).transpose()?)
        }
    };
}
pub(super) use shared_reads;

/// The seal's census, report and mark, and the tally of a parent's rows, as
/// steps of a write transaction `$tx`; `$now` is the dialect's clock.
macro_rules! seal_steps {
    ($tx:ty, $now:expr) => {
        /// Marks a parent decomposed with the projection of its rows, complete or not.
        pub(in crate::store) async fn mark_decomposed(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
            rows: &$crate::ledger::projection::Tally,
            complete: bool,
        ) -> $crate::store::StoreResult<()> {
            static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                format!(
                    "UPDATE parent SET total = $2, processed = $3, failed = $4, skipped = $5, decomposed_at = {now}, \
                         completed_at = CASE WHEN $6 THEN {now} END \
                     WHERE parent_id = $1",
                    now = $now
                )
            });
            sqlx::query(sqlx::AssertSqlSafe(SQL.as_str()))
                .bind(parent_id.as_str())
                .bind(rows.total)
                .bind(rows.processed)
                .bind(rows.failed)
                .bind(rows.skipped)
                .bind(complete)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// Opens the lane of a parent just marked decomposed (`sql::OPEN_LANE`).
        pub(in crate::store) async fn open_lane(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
        ) -> $crate::store::StoreResult<()> {
            sqlx::query($crate::store::sql::OPEN_LANE)
                .bind(parent_id.as_str())
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// Counts appended children into a decomposing parent's projection.
        pub(in crate::store) async fn count_appended(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
            inserted: u64,
            skipped: i64,
            child_bytes: i64,
        ) -> $crate::store::StoreResult<()> {
            sqlx::query($crate::store::sql::COUNT_APPENDED)
                .bind(parent_id.as_str())
                .bind(inserted as i64)
                .bind(skipped)
                .bind(child_bytes)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// Stored sequences below `total`, and at or past it.
        pub(in crate::store) async fn seal_census(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
            total: i64,
        ) -> $crate::store::StoreResult<$crate::store::rows::SealCensus> {
            let (below, beyond): (i64, i64) = sqlx::query_as($crate::store::sql::SEAL_CENSUS)
                .bind(parent_id.as_str())
                .bind(total)
                .fetch_one(&mut **tx)
                .await?;
            Ok($crate::store::rows::SealCensus { below, beyond })
        }

        /// What a seal mismatch names, `limit` of each at most.
        pub(in crate::store) async fn seal_report(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
            total: i64,
            limit: i64,
        ) -> $crate::store::StoreResult<$crate::store::rows::SealReport> {
            let first = sqlx::query_scalar($crate::store::sql::SEAL_FIRST)
                .bind(parent_id.as_str())
                .bind(total)
                .fetch_one(&mut **tx)
                .await?;
            let gaps = sqlx::query_as($crate::store::sql::SEAL_GAPS)
                .bind(parent_id.as_str())
                .bind(total)
                .bind(limit + 1)
                .fetch_all(&mut **tx)
                .await?;
            let extra = sqlx::query_scalar($crate::store::sql::SEAL_EXTRA)
                .bind(parent_id.as_str())
                .bind(total)
                .bind(limit)
                .fetch_all(&mut **tx)
                .await?;
            Ok($crate::store::rows::SealReport { first, gaps, extra })
        }

        /// The projection derived from a parent's rows.
        pub(in crate::store) async fn tally(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
        ) -> $crate::store::StoreResult<$crate::ledger::projection::Tally> {
            let (total, processed, failed, skipped) = sqlx::query_as($crate::store::sql::TERMINAL_TALLY)
                .bind(parent_id.as_str())
                .fetch_one(&mut **tx)
                .await?;
            Ok($crate::ledger::projection::Tally {
                total,
                processed,
                failed,
                skipped,
            })
        }
    };
}
pub(super) use seal_steps;

/// The stored projection read for reconcile and its repair, in a write
/// transaction `$tx`; `$lock` is appended to the read (`FOR UPDATE` where rows
/// lock one by one) and `$now` is the dialect's clock.
macro_rules! projection_steps {
    ($tx:ty, $lock:literal, $now:expr) => {
        /// Writes the derived projection over the stored one.
        pub(in crate::store) async fn repair(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
            derived: &$crate::ledger::projection::Tally,
            open: $crate::ledger::projection::Open,
            completion: $crate::ledger::projection::CompletionRepair,
        ) -> $crate::store::StoreResult<()> {
            use $crate::ledger::projection::CompletionRepair;
            let completed_at = match completion {
                CompletionRepair::Keep => "completed_at",
                CompletionRepair::Set => $now,
                CompletionRepair::Clear => "NULL",
            };
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE parent SET total = $2, processed = $3, failed = $4, skipped = $5, \
                     settled_in_flight = 0, settled_held = 0, completed_at = {completed_at} WHERE parent_id = $1"
            )))
            .bind(parent_id.as_str())
            .bind(derived.total)
            .bind(derived.processed)
            .bind(derived.failed)
            .bind(derived.skipped)
            .execute(&mut **tx)
            .await?;
            sqlx::query(
                "UPDATE lane SET claimed = $2, unclaimed = 0, held_in = $3, held_out = 0 WHERE parent_id = $1",
            )
            .bind(parent_id.as_str())
            .bind(open.in_flight)
            .bind(open.held)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        /// The stored projection, `None` when the parent is missing; the flag
        /// says it is decomposed.
        pub(in crate::store) async fn lock_projection(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
        ) -> $crate::store::StoreResult<Option<($crate::ledger::projection::StoredProjection, bool)>> {
            use sqlx::Row;
            static SQL: std::sync::LazyLock<String> =
                std::sync::LazyLock::new(|| format!("{}{}", $crate::store::sql::STORED_PROJECTION, $lock));
            let row = sqlx::query(sqlx::AssertSqlSafe(SQL.as_str()))
                .bind(parent_id.as_str())
                .fetch_optional(&mut **tx)
                .await?;
            let Some(row) = row else { return Ok(None) };
            // The lane after the parent, as every statement that locks both does.
            static LANE: std::sync::LazyLock<String> =
                std::sync::LazyLock::new(|| format!("{}{}", $crate::store::sql::LANE_OPEN, $lock));
            let lane: Option<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(LANE.as_str()))
                .bind(parent_id.as_str())
                .fetch_optional(&mut **tx)
                .await?;
            let (lane_in_flight, lane_held) = lane.unwrap_or_default();
            let stored = $crate::ledger::projection::StoredProjection {
                total: row.try_get("total")?,
                processed: row.try_get("processed")?,
                failed: row.try_get("failed")?,
                skipped: row.try_get("skipped")?,
                in_flight: lane_in_flight - row.try_get::<i64, _>("settled_in_flight")?,
                held: lane_held - row.try_get::<i64, _>("settled_held")?,
                completed_at: row.try_get("completed_at")?,
            };
            Ok(Some((stored, row.try_get("decomposed")?)))
        }

        /// A parent's in-flight and held children, counted.
        pub(in crate::store) async fn open_tally(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
        ) -> $crate::store::StoreResult<$crate::ledger::projection::Open> {
            let (in_flight, held) = sqlx::query_as($crate::store::sql::OPEN_TALLY)
                .bind(parent_id.as_str())
                .fetch_one(&mut **tx)
                .await?;
            Ok($crate::ledger::projection::Open { in_flight, held })
        }
    };
}
pub(super) use projection_steps;
