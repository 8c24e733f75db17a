//! Outcomes: first writer wins, one-way. The writes that win commit first, in
//! one statement per backend; the ones that lost are then told why, in their
//! own transaction, and the conflicting ones are kept in their child's log.

use std::collections::HashSet;
use std::sync::Arc;

use super::error::retry_transient;
use super::reports::Applied;
use super::{Store, StoreResult};
use crate::ledger::outcome::{losing_status, rounds};
use crate::ledger::{OutcomeStatus, OutcomeWrite};

/// How often a round is tried while its losers find their children open.
const ROUND_TRIES: usize = 3;

impl Store {
    /// Records terminal outcomes; the statuses come back in request order. A
    /// child named twice is recorded once: the later item goes in a later
    /// round (see `ledger::outcome::rounds`). The writes are shared, not
    /// copied, with the parent's combiner.
    pub async fn record_outcomes(&self, writes: Arc<[OutcomeWrite]>) -> StoreResult<Vec<OutcomeStatus>> {
        let rounds = rounds(&writes);
        if rounds.len() == 1 {
            return self.record_round(writes).await;
        }
        let mut statuses = vec![OutcomeStatus::NotFound; writes.len()];
        for round in rounds {
            let batch: Arc<[OutcomeWrite]> = round.iter().map(|&i| writes[i].clone()).collect();
            for (i, status) in round.into_iter().zip(self.record_round(batch).await?) {
                statuses[i] = status;
            }
        }
        Ok(statuses)
    }

    /// Records writes that each name a different child. The winners commit
    /// first; the losers are then told why. A loser whose child is open by
    /// then (its parent was sealed, or the child appended, in between) lost
    /// to nothing: it is tried again, a few times at most.
    async fn record_round(&self, writes: Arc<[OutcomeWrite]>) -> StoreResult<Vec<OutcomeStatus>> {
        let mut statuses = vec![OutcomeStatus::Applied; writes.len()];
        let mut trying: Vec<usize> = (0..writes.len()).collect();
        for attempt in 0..ROUND_TRIES {
            // The first try takes the writes as they are; only a retry copies
            // out the few that are tried again.
            let batch: Arc<[OutcomeWrite]> = if attempt == 0 {
                Arc::clone(&writes)
            } else {
                trying.iter().map(|&i| writes[i].clone()).collect()
            };
            let applied = self.apply(Arc::clone(&batch)).await?;
            self.completed(&applied.completed);
            self.parents_changed(applied.won.iter().map(|(parent_id, _)| parent_id));
            if applied.won.len() == batch.len() {
                return Ok(statuses);
            }
            let won: HashSet<(&str, i64)> = applied.won.iter().map(|(p, s)| (p.as_str(), *s)).collect();
            let lost: Vec<usize> = trying
                .into_iter()
                .filter(|&i| !won.contains(&(writes[i].parent_id.as_str(), writes[i].sequence)))
                .collect();
            let losers: Vec<&OutcomeWrite> = lost.iter().map(|&i| &writes[i]).collect();
            let told = retry_transient(|| self.classify_losers(&losers)).await?;
            trying = Vec::new();
            for (i, status) in lost.into_iter().zip(told) {
                match status {
                    Some(status) => statuses[i] = status,
                    None => trying.push(i),
                }
            }
            if trying.is_empty() {
                return Ok(statuses);
            }
        }
        // Still open after every try: the parent keeps changing under the
        // write; say so as a refusal the client can retry.
        for i in trying {
            statuses[i] = OutcomeStatus::NotDecomposed;
        }
        Ok(statuses)
    }

    /// Applies writes. A batch of one parent (what a claim hands out) goes
    /// through the parent's combiner: batches that arrive while one of the
    /// parent's statements runs share the next statement and commit.
    async fn apply(&self, writes: Arc<[OutcomeWrite]>) -> StoreResult<Applied> {
        let Some(first) = writes.first() else {
            return Ok(Applied::default());
        };
        if writes.iter().any(|w| w.parent_id != first.parent_id) {
            return self.db.apply_outcomes(&writes).await;
        }
        let store = self.clone();
        let parent_id = first.parent_id.clone();
        self.outcome_batches
            .submit(parent_id, writes, move |batches| {
                let store = store.clone();
                async move { store.apply_combined(batches).await }
            })
            .await
    }

    /// Applies batches of one parent in as few statements as their children
    /// allow (a child named by two batches goes in two statements, in arrival
    /// order), and tells each batch which of its writes won. A parent the
    /// statement completed is told to one batch, so it is counted once.
    async fn apply_combined(&self, batches: Vec<Arc<[OutcomeWrite]>>) -> StoreResult<Vec<Applied>> {
        let mut answers: Vec<Applied> = batches.iter().map(|_| Applied::default()).collect();
        let mut start = 0;
        while start < batches.len() {
            let mut named = HashSet::new();
            let mut end = start;
            while end < batches.len() && batches[end].iter().all(|w| !named.contains(&w.sequence)) {
                named.extend(batches[end].iter().map(|w| w.sequence));
                end += 1;
            }
            let applied = if end - start == 1 {
                self.db.apply_outcomes(&batches[start]).await?
            } else {
                self.db.apply_outcomes(&batches[start..end].concat()).await?
            };
            let won: HashSet<i64> = applied.won.iter().map(|(_, sequence)| *sequence).collect();
            for (batch, answer) in batches[start..end].iter().zip(&mut answers[start..end]) {
                answer.won = batch
                    .iter()
                    .filter(|w| won.contains(&w.sequence))
                    .map(|w| (w.parent_id.clone(), w.sequence))
                    .collect();
            }
            answers[end - 1].completed = applied.completed;
            start = end;
        }
        Ok(answers)
    }

    /// Why each write that did not win lost (`None`: it can still win),
    /// logging the conflicting ones in the child's conflict log, in one
    /// transaction.
    async fn classify_losers(&self, losers: &[&OutcomeWrite]) -> StoreResult<Vec<Option<OutcomeStatus>>> {
        let mut tx = self.db.begin().await?;
        let facts = tx.loser_facts(losers).await?;
        let mut statuses = Vec::with_capacity(losers.len());
        for (write, facts) in losers.iter().zip(facts) {
            let status = losing_status(facts.parent_decomposed, facts.state, facts.fenced_out, write.outcome);
            if status == Some(OutcomeStatus::Conflict) {
                tx.log_conflict(write).await?;
            }
            statuses.push(status);
        }
        tx.commit().await?;
        Ok(statuses)
    }
}
