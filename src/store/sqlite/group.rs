//! Group commit on SQLite's one writer: the lane claims and outcome batches
//! that arrive while the writer's transaction runs wait, and go together in
//! the next one: one `BEGIN IMMEDIATE`, one `COMMIT` and one `fsync` for all
//! of them, whatever their parents.
//!
//! SQLite runs its writes one at a time anyway, so a write that waits for the
//! next group waits no longer than it would have for the lock; what a group
//! saves is each member's own transaction: the two round trips to the
//! writer's thread that begin it, the one that commits it, and its `fsync`
//! (with eight workers on two parents, about half of a burn-down's writes
//! arrive while another runs). The first write runs at once, alone: at rest
//! each runs as before. Every member is answered once the group has
//! committed, so an answer still means durable.
//!
//! The group runs in a task of its own (`combine`), which a request going
//! away does not stop: a member's statements cannot be interrupted halfway
//! by its request, so one request's timeout never undoes its neighbours'
//! writes. When the group fails, nothing of it was committed: if the
//! database is unavailable every member is told so; otherwise each member is
//! run again in a transaction of its own, so a failure is answered to the
//! member it belongs to.

use std::sync::Arc;

use super::lane_claim::Picked;
use super::{SqliteStore, outcomes};
use crate::ledger::{OutcomeWrite, ParentId, QueueName};
use crate::store::combine::Combiner;
use crate::store::reports::{Applied, LaneAsk, LaneClaim};
use crate::store::{StoreError, StoreResult};

/// A write the group runs.
pub(super) enum Write {
    /// A lane claim: `asks` in turn on one parent's lane, in the queue given.
    Claim {
        parent_id: ParentId,
        queue: Option<QueueName>,
        asks: Vec<LaneAsk>,
    },
    /// An outcome batch.
    Outcomes(Vec<OutcomeWrite>),
}

/// What a write of the group did, once committed.
pub(super) enum Written {
    Claims(Vec<LaneClaim>),
    Applied(Applied),
}

/// What a write did before its group committed.
enum Done {
    Claims(Vec<Picked>),
    Applied(Applied),
}

impl Done {
    /// The answer, once committed (a claim's children are parsed now).
    fn finish(self) -> StoreResult<Written> {
        Ok(match self {
            Self::Claims(picked) => Written::Claims(picked.into_iter().map(Picked::finish).collect::<Result<_, _>>()?),
            Self::Applied(applied) => Written::Applied(applied),
        })
    }
}

/// The writes waiting for the writer's next transaction: one key, one runner.
pub(super) type Group = Combiner<(), Write, StoreResult<Written>>;

pub(super) fn group() -> Arc<Group> {
    Arc::new(Combiner::new(1))
}

impl SqliteStore {
    /// Runs `write` in the writer's next group transaction; answered once it committed.
    pub(super) async fn in_group(&self, write: Write) -> StoreResult<Written> {
        let store = self.clone();
        self.group
            .submit((), write, move |writes| {
                let store = store.clone();
                async move { store.run_group(writes).await }
            })
            .await?
    }

    /// Runs `writes` in one transaction; when that fails for another reason
    /// than an unavailable database, each in one of its own.
    async fn run_group(&self, writes: Vec<Write>) -> StoreResult<Vec<StoreResult<Written>>> {
        match self.run_together(&writes).await {
            Ok(done) => Ok(done.into_iter().map(Done::finish).collect()),
            Err(err) if writes.len() == 1 || matches!(err, StoreError::Unavailable(_)) => Err(err),
            Err(_) => {
                let mut answers = Vec::with_capacity(writes.len());
                for write in &writes {
                    let done = self.run_together(std::slice::from_ref(write)).await;
                    answers.push(done.and_then(|mut done| done.remove(0).finish()));
                }
                Ok(answers)
            }
        }
    }

    /// Runs `writes` in arrival order in one write transaction, and commits.
    async fn run_together(&self, writes: &[Write]) -> StoreResult<Vec<Done>> {
        let mut tx = self.held_tx().await?;
        let mut done = Vec::with_capacity(writes.len());
        for write in writes {
            done.push(match write {
                Write::Claim { parent_id, queue, asks } => {
                    let mut picked = Vec::with_capacity(asks.len());
                    for ask in asks {
                        picked.push(Self::claim_one(&mut tx, parent_id, queue.as_ref(), ask).await?);
                    }
                    Done::Claims(picked)
                }
                Write::Outcomes(writes) => Done::Applied(outcomes::apply_outcomes(&mut tx, writes).await?),
            });
        }
        tx.commit().await?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::admission::ParentAdmission;
    use crate::ledger::{ExpiredLease, NewChild, Outcome, Registration};
    use crate::store::{Store, StoreOptions};

    fn registration(parent_id: &str, children: i64) -> Registration {
        Registration {
            parent_id: ParentId::parse(parent_id).unwrap(),
            queue: QueueName::parse("group").unwrap(),
            payload: None,
            decomposed: true,
            max_attempts: None,
            expired_lease: ExpiredLease::default(),
            priority: 0,
            webhook_url: None,
            admission: ParentAdmission::default(),
            tolerance: None,
            children: (0..children)
                .map(|sequence| NewChild {
                    sequence,
                    key: None,
                    payload: serde_json::value::RawValue::from_string(format!("{{\"n\":{sequence}}}")).unwrap(),
                    skip: None,
                    traceparent: None,
                    not_before: None,
                })
                .collect(),
            fingerprint: format!("group-test-{parent_id}"),
            traceparent: None,
        }
    }

    /// Every child of `parent_id` failed, by no claim: each write rewrites its row.
    fn failed(parent_id: &str, children: i64) -> Write {
        Write::Outcomes(
            (0..children)
                .map(|sequence| OutcomeWrite {
                    parent_id: ParentId::parse(parent_id).unwrap(),
                    sequence,
                    outcome: Outcome::Failed,
                    reason: Some("boom".to_owned()),
                    result: None,
                    claim_id: None,
                })
                .collect(),
        )
    }

    async fn failed_children(store: &SqliteStore, parent_id: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM child_status WHERE parent_id = ?1 AND state = 'failed'")
            .bind(parent_id)
            .fetch_one(&store.readers)
            .await
            .unwrap()
    }

    /// A group whose transaction fails is run again member by member: the
    /// member that fails is answered its error, its neighbours are committed
    /// and answered as if each had run alone; a group of one is answered the
    /// error as it is.
    #[tokio::test]
    async fn a_failing_member_fails_alone() {
        let dir = std::env::temp_dir().join(format!("group-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("ledger.db").display());
        let ledger = Store::connect(&url).await.unwrap();
        ledger.migrate().await.unwrap();
        for parent_id in ["good", "bad", "later"] {
            ledger.register(&registration(parent_id, 3)).await.unwrap();
        }
        let store = SqliteStore::connect(&url, &StoreOptions::default()).await.unwrap();
        // Any write to one parent's children fails inside the statement.
        sqlx::query(
            "CREATE TRIGGER refuse_bad BEFORE UPDATE ON child WHEN old.parent_id = 'bad' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        )
        .execute(&store.writer)
        .await
        .unwrap();

        let answers = store
            .run_group(vec![failed("good", 3), failed("bad", 3), failed("later", 2)])
            .await
            .unwrap();
        assert_eq!(answers.len(), 3);
        let won = |answer: &StoreResult<Written>| match answer {
            Ok(Written::Applied(applied)) => applied.won.len(),
            Ok(Written::Claims(_)) => panic!("an outcome batch answered with claims"),
            Err(err) => panic!("a member that did not fail was answered {err}"),
        };
        assert_eq!(won(&answers[0]), 3);
        assert!(answers[1].is_err(), "the failing member was answered success");
        assert_eq!(won(&answers[2]), 2);
        assert_eq!(failed_children(&store, "good").await, 3);
        assert_eq!(failed_children(&store, "bad").await, 0);
        assert_eq!(failed_children(&store, "later").await, 2);
        // The counters moved with the rows that did.
        let counted: Vec<(String, i64)> = sqlx::query_as("SELECT parent_id, failed FROM parent ORDER BY parent_id")
            .fetch_all(&store.readers)
            .await
            .unwrap();
        assert_eq!(
            counted,
            vec![("bad".to_owned(), 0), ("good".to_owned(), 3), ("later".to_owned(), 2)]
        );

        // Alone, the failing write is answered its error; nothing of it is kept.
        assert!(store.run_group(vec![failed("bad", 1)]).await.is_err());
        assert_eq!(failed_children(&store, "bad").await, 0);
        drop((store, ledger));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
