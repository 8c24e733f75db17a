//! Parents: registration, appends, the seal, and reads.

use super::{
    ChildFilter, ChildPage, ChildSearch, Db, ParentFilter, ParentPage, Store, StoreError, StoreResult, Tx, WRITE_CHUNK,
    dispatch, in_tx, webhooks,
};
use crate::ledger::budget::{ByteBudget, json_len};
use crate::ledger::projection::{self, SEAL_REPORT_LIMIT};
use crate::ledger::{Appended, Child, ChildState, NewChild, Parent, ParentId, QueueName, Registration};

/// How many differing sequences an append conflict names at most.
const DIFFERING_REPORTED: usize = 100;

/// Children a pruner's transaction deletes at most.
const PRUNE_BATCH: i64 = 5_000;

/// Children read per statement while a page is filled.
const PAGE_CHUNK: i64 = 100;

impl Store {
    /// Registers a parent with its children in one transaction. Returns whether
    /// this call created it (`false`: an identical registration already existed).
    pub async fn register(&self, registration: &Registration) -> StoreResult<(bool, Parent)> {
        let parent_id = &registration.parent_id;
        let mut tx = self.begin().await?;
        let Some(completed) = in_tx!(&mut tx, parents::insert_parent(registration))? else {
            drop(tx);
            let stored = dispatch!(self, s => s.fingerprint(parent_id).await)?;
            if stored.as_deref() != Some(&registration.fingerprint) {
                return Err(StoreError::RegistrationConflict(parent_id.clone()));
            }
            return Ok((false, self.parent(parent_id, false).await?));
        };
        let (inserted, _) = self
            .insert_children(&mut tx, parent_id, &registration.children, false)
            .await?;
        if registration.decomposed {
            in_tx!(&mut tx, parents::open_lane(parent_id))?;
        }
        if completed {
            webhooks::enqueue_completed(&mut tx, std::slice::from_ref(parent_id)).await?;
        }
        tx.commit().await?;
        if completed {
            self.completed(std::slice::from_ref(parent_id));
        }
        dispatch!(self, s => s.after_bulk_write(inserted as i64).await)?;
        Ok((true, self.parent(parent_id, false).await?))
    }

    /// Appends children to a decomposing parent, idempotent per sequence: the
    /// same content again is a no-op, different content writes nothing.
    pub async fn append(&self, parent_id: &ParentId, children: &[NewChild]) -> StoreResult<Appended> {
        let mut tx = self.begin().await?;
        match in_tx!(&mut tx, parents::lock_decomposed(parent_id))? {
            None => return Err(StoreError::ParentNotFound(parent_id.clone())),
            Some(true) => return Err(StoreError::ParentDecomposed(parent_id.clone())),
            Some(false) => {}
        }
        let (inserted, skipped) = self.insert_children(&mut tx, parent_id, children, true).await?;
        let mut differing = Vec::new();
        for chunk in children.chunks(WRITE_CHUNK) {
            differing.extend(in_tx!(&mut tx, parents::differing_sequences(parent_id, chunk))?);
            if differing.len() >= DIFFERING_REPORTED {
                differing.truncate(DIFFERING_REPORTED);
                break;
            }
        }
        if !differing.is_empty() {
            return Err(StoreError::ChildrenConflict {
                parent_id: parent_id.clone(),
                sequences: differing,
            });
        }
        let child_bytes = crate::ledger::budget::largest_payload(children);
        in_tx!(
            &mut tx,
            parents::count_appended(parent_id, inserted, skipped, child_bytes)
        )?;
        tx.commit().await?;
        dispatch!(self, s => s.after_bulk_write(inserted as i64).await)?;
        Ok(Appended {
            inserted,
            existing: children.len() as u64 - inserted,
        })
    }

    /// Writes children in statements of `WRITE_CHUNK`. Returns how many rows
    /// were written and how many of those were skipped children.
    async fn insert_children(
        &self,
        tx: &mut Tx,
        parent_id: &ParentId,
        children: &[NewChild],
        idempotent: bool,
    ) -> StoreResult<(u64, i64)> {
        let (mut inserted, mut skipped) = (0, 0);
        for chunk in children.chunks(WRITE_CHUNK) {
            let (i, s) = in_tx!(&mut *tx, parents::insert_chunk(parent_id, chunk, idempotent))?;
            inserted += i;
            skipped += s;
        }
        Ok((inserted, skipped))
    }

    /// Marks a decomposing parent decomposed when exactly `0..total` are stored;
    /// a sealed parent is returned as it is.
    pub async fn seal(&self, parent_id: &ParentId, total: i64) -> StoreResult<Parent> {
        let mut tx = self.begin().await?;
        let decomposed = in_tx!(&mut tx, parents::lock_decomposed(parent_id))?
            .ok_or_else(|| StoreError::ParentNotFound(parent_id.clone()))?;
        let census = in_tx!(&mut tx, parents::seal_census(parent_id, total))?;
        if !census.matches(total) {
            let report = in_tx!(
                &mut tx,
                parents::seal_report(parent_id, total, SEAL_REPORT_LIMIT as i64)
            )?;
            return Err(StoreError::SealMismatch {
                total,
                missing: projection::missing_sequences(total, report.first, &report.gaps),
                extra: report.extra,
            });
        }
        let mut completed = false;
        if !decomposed {
            let rows = in_tx!(&mut tx, parents::tally(parent_id))?;
            completed = rows.is_complete(true);
            in_tx!(&mut tx, parents::mark_decomposed(parent_id, &rows, completed))?;
            in_tx!(&mut tx, parents::open_lane(parent_id))?;
            if completed {
                webhooks::enqueue_completed(&mut tx, std::slice::from_ref(parent_id)).await?;
            }
        }
        tx.commit().await?;
        if completed {
            self.completed(std::slice::from_ref(parent_id));
        }
        self.parent(parent_id, false).await
    }

    pub async fn parent(&self, parent_id: &ParentId, include_payload: bool) -> StoreResult<Parent> {
        dispatch!(self, s => s.parent(parent_id, include_payload).await)?
            .ok_or_else(|| StoreError::ParentNotFound(parent_id.clone()))
    }

    /// The queue of a parent, if it exists.
    pub async fn queue_of(&self, parent_id: &ParentId) -> StoreResult<Option<QueueName>> {
        Ok(dispatch!(self, s => s.queue_of(parent_id).await)?.map(QueueName::from_ledger))
    }

    pub async fn list_parents(&self, filter: &ParentFilter) -> StoreResult<ParentPage> {
        // One row past the page says whether another page follows.
        let mut rows = dispatch!(self, s => s.list_parents(filter, filter.limit + 1).await)?;
        let more = rows.len() as i64 > filter.limit;
        rows.truncate(filter.limit as usize);
        let next_position = rows.last().map(|(position, _)| *position).filter(|_| more);
        Ok(ParentPage {
            parents: rows.into_iter().map(|(_, parent)| parent).collect(),
            next_position,
        })
    }

    /// A page of a parent's children after `after`: up to `limit`, and fewer
    /// when more would not fit in `budget` (`next_after` goes on from there).
    /// Read in chunks, so a page of large children never sits in memory at once.
    pub async fn children(
        &self,
        parent_id: &ParentId,
        state: Option<ChildState>,
        after: Option<i64>,
        limit: i64,
        mut budget: ByteBudget,
    ) -> StoreResult<ChildPage> {
        let mut children: Vec<Child> = Vec::new();
        let mut cursor = after;
        loop {
            let want = (limit - children.len() as i64).min(PAGE_CHUNK);
            // One row past the chunk says whether more follow.
            let mut chunk = dispatch!(self, s => s.children(parent_id, state, cursor, want + 1).await)?;
            let more = chunk.len() as i64 > want;
            chunk.truncate(want as usize);
            for child in chunk {
                // The first child always goes: `Limits::check` makes room for the largest.
                // (+1: the comma before it.)
                if !budget.take(json_len(&child) + 1) && !children.is_empty() {
                    let next_after = children.last().map(|c| c.sequence);
                    return Ok(ChildPage { children, next_after });
                }
                children.push(child);
            }
            cursor = children.last().map(|c| c.sequence);
            if !more || children.len() as i64 >= limit {
                if children.is_empty() {
                    self.require_parent(parent_id).await?;
                }
                return Ok(ChildPage {
                    next_after: cursor.filter(|_| more),
                    children,
                });
            }
        }
    }

    /// A page of children across parents, newest change first (see
    /// `ChildFilter`), read like a parent's pages: a chunk at a time, stopping
    /// before the response outgrows `budget`. `next` is the last child's key
    /// when more may follow.
    pub async fn search_children(&self, mut filter: ChildFilter, mut budget: ByteBudget) -> StoreResult<ChildSearch> {
        let limit = filter.limit;
        let mut children: Vec<Child> = Vec::new();
        let key = |c: &Child| (c.changed_at, c.parent_id.clone(), c.sequence);
        loop {
            let want = (limit - children.len() as i64).min(PAGE_CHUNK);
            filter.limit = want + 1;
            let mut chunk = dispatch!(self, s => s.search_children(&filter).await)?;
            let more = chunk.len() as i64 > want;
            chunk.truncate(want as usize);
            for child in chunk {
                if !budget.take(json_len(&child) + 1) && !children.is_empty() {
                    let next = children.last().map(key);
                    return Ok(ChildSearch { children, next });
                }
                children.push(child);
            }
            filter.after = children.last().map(key);
            if !more || children.len() as i64 >= limit {
                return Ok(ChildSearch {
                    next: filter.after.filter(|_| more),
                    children,
                });
            }
        }
    }

    /// Cancels a parent: every child not yet terminal becomes `skipped` with
    /// `reason`, in one transaction, and the parent (sealed at what it holds,
    /// if it was still being decomposed) completes. A holder's later outcome
    /// loses to it and is logged as a conflict. Children are locked before the
    /// parent row, as outcomes lock them. Returns how many children it skipped.
    pub async fn cancel(&self, parent_id: &ParentId, reason: &str) -> StoreResult<i64> {
        let mut tx = self.begin().await?;
        let skipped = in_tx!(&mut tx, parents::skip_open_children(parent_id, reason))?;
        let Some(was_complete) = in_tx!(&mut tx, parents::lock_complete(parent_id))? else {
            return Err(StoreError::ParentNotFound(parent_id.clone()));
        };
        in_tx!(&mut tx, parents::close_cancelled(parent_id, skipped))?;
        if !was_complete {
            webhooks::enqueue_completed(&mut tx, std::slice::from_ref(parent_id)).await?;
        }
        tx.commit().await?;
        if !was_complete {
            self.completed(std::slice::from_ref(parent_id));
        }
        Ok(skipped.0)
    }

    /// Deletes a complete parent now (`DELETE /v1/parents/{id}`), as the
    /// pruner does (see `prune`).
    /// Whether this call deleted it (a pruner may have been first).
    pub async fn delete_parent(&self, parent_id: &ParentId) -> StoreResult<bool> {
        match dispatch!(self, s => s.parent_complete(parent_id).await)? {
            None => Err(StoreError::ParentNotFound(parent_id.clone())),
            Some(false) => Err(StoreError::ParentNotComplete(parent_id.clone())),
            Some(true) => self.prune(parent_id, 0).await,
        }
    }

    /// Complete parents whose completion is older than `age`, oldest first:
    /// the pruner's next batch.
    pub async fn prunable(&self, age: std::time::Duration, limit: i64) -> StoreResult<Vec<ParentId>> {
        let ids = dispatch!(self, s => s.prunable(age, limit).await)?;
        Ok(ids.into_iter().map(ParentId::from_ledger).collect())
    }

    /// Deletes a complete parent with its children: the children in batches
    /// of `PRUNE_BATCH`, each its own transaction, so no lock is held for long
    /// and nothing a claim needs is touched; the parent row last. Two replicas
    /// pruning the same parent delete it once. After each batch it rests
    /// `pace` times as long as the batch took (the background pruner yields
    /// the database to the work it serves; `0` for an operator's delete).
    /// Whether this call deleted the parent.
    pub async fn prune(&self, parent_id: &ParentId, pace: u32) -> StoreResult<bool> {
        loop {
            let started = std::time::Instant::now();
            let deleted = dispatch!(self, s => s.delete_children(parent_id, PRUNE_BATCH).await)?;
            if deleted < PRUNE_BATCH as u64 {
                break;
            }
            tokio::time::sleep(started.elapsed() * pace).await;
        }
        let deleted = dispatch!(self, s => s.delete_parent_row(parent_id).await)?;
        self.child_bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(parent_id);
        Ok(deleted)
    }

    pub async fn child(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<Child> {
        dispatch!(self, s => s.child(parent_id, sequence).await)?.ok_or_else(|| StoreError::ChildNotFound {
            parent_id: parent_id.clone(),
            sequence,
        })
    }

    /// `ParentNotFound` unless the parent exists.
    pub(super) async fn require_parent(&self, parent_id: &ParentId) -> StoreResult<()> {
        if dispatch!(self, s => s.parent_exists(parent_id).await)? {
            Ok(())
        } else {
            Err(StoreError::ParentNotFound(parent_id.clone()))
        }
    }
}
