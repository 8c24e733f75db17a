//! The statements the children search reads with: one per source and way of
//! starting (`Start`), each walking one index in the search's order, newest
//! change first, so a read costs what it returns, not what lies above it.
//!
//! Binds, in every statement below:
//! - walks across parents: `$1` time, `$2` parent, `$3` sequence (the
//!   position to read below; unused on a first read), `$4` how many, and for
//!   the walks that keep a queue's or a scope's children `$5` queue (NULL:
//!   any) and `$6` the reader's scope (`QueueScope::as_json`, NULL: every
//!   queue);
//! - walks of one parent: `$1` time, `$2` sequence (the position within the
//!   parent, see `Start`), `$3` parent, `$4` how many, and `$5` the lane's
//!   floor for the never-claimed children.

use std::sync::LazyLock;

use crate::ledger::ChildState;
use crate::store::sql;
use crate::store::statement::{Dialect, Sql, SqlSet};

/// How a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// From the newest.
    Top,
    /// Below a position (`(time, parent, sequence) <`).
    Below,
    /// Of one parent: below a position of that parent's own.
    Own,
}

impl Start {
    fn index(self) -> usize {
        match self {
            Self::Top => 0,
            Self::Below => 1,
            Self::Own => 2,
        }
    }
}

/// The terminal and held states the indexes of settled children hold, as
/// Postgres's name them (after the one state a statement reads: SQLite takes
/// the first term of a column for the index, and an `IN` there would lose the
/// index's order). SQLite's name them as an OR of equalities (its migration
/// 0020), which that first term implies. Processed children are found
/// through their outcome batches (`processed_rows`).
const SETTLED_STATES: &str = "('failed', 'skipped', 'held')";

/// A child row's own columns, as `rows::child` reads them, for a child no
/// lease holds (terminal, held, pending).
const ROW_COLUMNS: &str = "c.parent_id, c.sequence, c.key, c.state, c.payload, c.attempts, c.claim_id, \
    c.claimed_by, c.lease_expires_at, c.previous_attempt, c.available_at, c.not_before, c.reason, c.result, \
    c.outcome_attempt, c.terminal_at, c.changed_at, c.conflicts, c.conflict_count, c.redrive_of_parent, \
    c.redrive_of_sequence";

/// A processed child's columns, as `rows::child` reads them, from its row
/// `c` and the outcome batch `x` that names it: a batch with a claim
/// recorded its children without rewriting their rows (migration 0023 on
/// Postgres), which say what the claim found, and the batch the rest.
static PROCESSED_COLUMNS: LazyLock<String> = LazyLock::new(|| {
    sql::child_columns_of("false", &|_| "NULL".to_owned(), "x.claim_id IS NOT NULL", &|column| {
        format!("x.{column}")
    })
});

/// The row of processed child `x` (`c`): processed, or, when its batch has a
/// claim, as that claim found it (pending).
const PROCESSED_ROW: &str = "c.parent_id = x.parent_id AND c.sequence = x.sequence \
    AND (c.state = 'processed' OR (x.claim_id IS NOT NULL AND c.state = 'pending'))";

/// Whether the child row `c` (pending, no `available_at`) is one a lease
/// holds: its parent has a lane whose floor has passed it (`sql::leased`).
const IN_FLIGHT: &str = "coalesce((SELECT coalesce(c.sequence < ln.floor, true) FROM lane ln \
    WHERE ln.parent_id = c.parent_id), false)";

/// Whether the parent `parent_id` names is in queue `$5` (if given) and the scope `$6`.
fn reached(d: &Dialect, parent_id: &str) -> String {
    format!(
        "coalesce((SELECT ($5 IS NULL OR p.queue = $5) AND {} FROM parent p WHERE p.parent_id = {parent_id}), false)",
        (d.within)("$6")
    )
}

/// The position condition of a walk across parents over the key `at`, `c.parent_id`, `c.sequence`.
fn below(start: Start, at: &str, parent: &str) -> String {
    below_triple(start, at, parent, "c.sequence")
}

/// The position condition of a walk across parents over the key `at`, `parent`, `sequence`.
fn below_triple(start: Start, at: &str, parent: &str, sequence: &str) -> String {
    match start {
        Start::Top => "AND ($1 IS NULL OR $2 IS NULL OR $3 IS NULL OR true)".to_owned(),
        _ => format!("AND ({at}, {parent}, {sequence}) < ($1, $2, $3)"),
    }
}

/// The position condition of a walk of one parent over `at` and `sequence`.
fn below_in_parent(start: Start, at: &str, sequence: &str) -> String {
    match start {
        Start::Top => "AND ($1 IS NULL OR $2 IS NULL OR true)".to_owned(),
        _ => format!("AND ({at}, {sequence}) < ($1, $2)"),
    }
}

const ORDER: &str = "ORDER BY c.changed_at DESC, c.parent_id DESC, c.sequence DESC";
const ORDER_IN_PARENT: &str = "ORDER BY c.changed_at DESC, c.sequence DESC";

/// Children of terminal or held state `state` across parents, whole rows
/// (`child_attention`; processed ones through their batches, `processed_rows`).
fn settled_rows(d: &Dialect, state: ChildState, start: Start) -> String {
    if state == ChildState::Processed {
        return processed_rows(d, start);
    }
    format!(
        "SELECT {ROW_COLUMNS} FROM child c {index} \
         WHERE c.state = '{state}' AND c.state IN {SETTLED_STATES} {below} {ORDER} LIMIT $4",
        index = (d.indexed_by)("child_attention"),
        state = state.as_str(),
        below = below(start, "c.changed_at", "c.parent_id"),
    )
}

/// `settled_rows` as keys, each saying whether it is in the queue and scope.
fn settled_keys(d: &Dialect, state: ChildState, start: Start) -> String {
    if state == ChildState::Processed {
        return processed_keys(d, start);
    }
    format!(
        "SELECT c.changed_at, c.parent_id, c.sequence, {reached} AS hit, false AS in_flight FROM child c {index} \
         WHERE c.state = '{state}' AND c.state IN {SETTLED_STATES} {below} {ORDER} LIMIT $4",
        index = (d.indexed_by)("child_attention"),
        reached = reached(d, "c.parent_id"),
        state = state.as_str(),
        below = below(start, "c.changed_at", "c.parent_id"),
    )
}

/// One parent's children of terminal or held state `state` (`child_settled_by_parent`;
/// processed ones through their batches, `processed_of_parent`).
fn settled_of_parent(d: &Dialect, state: ChildState, start: Start) -> String {
    if state == ChildState::Processed {
        return processed_of_parent(d, start);
    }
    format!(
        "SELECT {ROW_COLUMNS} FROM child c {index} \
         WHERE c.parent_id = $3 AND c.state = '{state}' AND c.state IN {SETTLED_STATES} {below} \
         {ORDER_IN_PARENT} LIMIT $4",
        index = (d.indexed_by)("child_settled_by_parent"),
        state = state.as_str(),
        below = below_in_parent(start, "c.changed_at", "c.sequence"),
    )
}

/// The processed children across parents as keys (`changed_at`, parent,
/// sequence), newest first: the outcome batches that made them
/// (`processed_batch`, read in `processed_batch_changed`'s order down from
/// the position), each unpacked into its children. `hit`: the queue and
/// scope test of a walk that keeps them (`kept`), else true.
fn processed_keys_of(d: &Dialect, start: Start, kept: bool) -> String {
    let hit = if kept {
        reached(d, "b.parent_id")
    } else {
        "true".to_owned()
    };
    format!(
        "SELECT b.changed_at, b.parent_id, ls.value AS sequence, b.claim_id, b.worker, b.expires_at, \
             {hit} AS hit, false AS in_flight \
         FROM processed_batch b CROSS JOIN {sequences} \
         WHERE true {bound} {below} \
         ORDER BY b.changed_at DESC, b.parent_id DESC, ls.value DESC LIMIT $4",
        sequences = (d.lease_sequences)("b"),
        bound = batch_bound(start, "b.changed_at", "b.parent_id"),
        below = below_triple(start, "b.changed_at", "b.parent_id", "ls.value"),
    )
}

/// A row for each key a processed walk read (`processed_rows`,
/// `processed_of_parent`): the key (`key_at`, `key_parent`,
/// `key_sequence`), and whether its child is there (`found`), with the
/// child's columns (NULL when not). The walk goes on from the last key, so a
/// batch that names children deleted since (a parent being pruned) does not
/// end it early.
const PROCESSED_FOUND: &str = "x.changed_at AS key_at, x.parent_id AS key_parent, x.sequence AS key_sequence, \
    c.parent_id IS NOT NULL AS found";

/// Processed children across parents, whole rows (`processed_keys_of`,
/// `PROCESSED_FOUND`). Every child a batch names is processed at the
/// batch's time (terminal is one-way); the join says so all the same.
fn processed_rows(d: &Dialect, start: Start) -> String {
    format!(
        "SELECT {PROCESSED_FOUND}, {processed} FROM ({keys}) x \
         LEFT JOIN child c ON {PROCESSED_ROW} \
         ORDER BY x.changed_at DESC, x.parent_id DESC, x.sequence DESC",
        keys = processed_keys_of(d, start, false),
        processed = PROCESSED_COLUMNS.as_str(),
    )
}

/// `processed_rows` as keys, each saying whether it is in the queue and scope.
fn processed_keys(d: &Dialect, start: Start) -> String {
    processed_keys_of(d, start, true)
}

/// One parent's processed children, newest first, through its outcome
/// batches (`processed_batch_parent`; `PROCESSED_FOUND`).
fn processed_of_parent(d: &Dialect, start: Start) -> String {
    let bound = match start {
        Start::Top => "",
        _ => "AND b.changed_at <= $1",
    };
    format!(
        "SELECT {PROCESSED_FOUND}, {processed} FROM ( \
             SELECT b.changed_at, b.parent_id, ls.value AS sequence, b.claim_id, b.worker, b.expires_at \
             FROM processed_batch b CROSS JOIN {sequences} \
             WHERE b.parent_id = $3 {bound} {below} \
             ORDER BY b.changed_at DESC, ls.value DESC LIMIT $4) x \
         LEFT JOIN child c ON {PROCESSED_ROW} \
         ORDER BY x.changed_at DESC, x.sequence DESC",
        sequences = (d.lease_sequences)("b"),
        below = below_in_parent(start, "b.changed_at", "ls.value"),
        processed = PROCESSED_COLUMNS.as_str(),
    )
}

/// The children leases list, newest claim first, as keys (`claimed_at`,
/// parent, sequence), each with its lease and whether to show it (`hit`);
/// `held`: the child is still in flight (a lease's list keeps the children
/// that have since had an outcome), with its row's columns (NULL when not).
/// The list is read (and sorted) before any child is looked up, so a read
/// looks up only the children it returns. `reach` keeps leases of one
/// parent (`h.parent_id = $3`) or of all; `hit` is the queue and scope test
/// for a walk that keeps them, else true.
fn leased(d: &Dialect, start: Start, one_parent: bool, kept: bool) -> String {
    let (reach, below, order) = if one_parent {
        (
            "h.parent_id = $3".to_owned(),
            below_in_parent(start, "h.claimed_at", "ls.value"),
            "ORDER BY h.claimed_at DESC, ls.value DESC",
        )
    } else {
        (
            format!("true {}", batch_bound(start, "h.claimed_at", "h.parent_id")),
            below_triple(start, "h.claimed_at", "h.parent_id", "ls.value"),
            "ORDER BY h.claimed_at DESC, h.parent_id DESC, ls.value DESC",
        )
    };
    let hit = if kept {
        reached(d, "h.parent_id")
    } else {
        "true".to_owned()
    };
    format!(
        "SELECT x.parent_id, x.sequence, c.key, 'in_flight' AS state, c.payload, c.attempts + 1 AS attempts, \
             x.claim_id, x.worker AS claimed_by, x.expires_at AS lease_expires_at, c.previous_attempt, \
             c.available_at, c.not_before, c.reason, c.result, c.outcome_attempt, c.terminal_at, x.claimed_at AS changed_at, \
             c.conflicts, c.conflict_count, x.hit, c.parent_id IS NOT NULL AS held \
         FROM (SELECT h.claimed_at, h.parent_id, ls.value AS sequence, h.claim_id, h.worker, h.expires_at, \
                   {hit} AS hit \
               FROM claim_lease h CROSS JOIN {sequences} \
               WHERE {reach} {below} {order} LIMIT $4) x \
         LEFT JOIN child c ON x.hit AND c.parent_id = x.parent_id AND c.sequence = x.sequence \
             AND c.state = 'pending' AND c.available_at IS NULL \
         ORDER BY x.claimed_at DESC, x.parent_id DESC, x.sequence DESC",
        sequences = (d.lease_sequences)("h"),
    )
}

/// The leases or outcome batches (at `at` of `parent`) a walk below a
/// position may still read, as a bound their index serves.
fn batch_bound(start: Start, at: &str, parent: &str) -> String {
    match start {
        Start::Top => String::new(),
        _ => format!("AND ({at}, {parent}) <= ($1, $2)"),
    }
}

/// Pending children without an `available_at` across parents: the
/// never-claimed ones and, passed over by the reader, the ones leases hold,
/// which say so (`in_flight`); `child_pending_changed`.
fn pending_rows(d: &Dialect, start: Start) -> String {
    format!(
        "SELECT {ROW_COLUMNS}, true AS hit, {IN_FLIGHT} AS in_flight FROM child c {index} \
         WHERE c.state = 'pending' AND c.available_at IS NULL {below} {ORDER} LIMIT $4",
        index = (d.indexed_by)("child_pending_changed"),
        below = below(start, "c.changed_at", "c.parent_id"),
    )
}

/// `pending_rows` as keys, each saying whether it is in the queue and scope.
fn pending_keys(d: &Dialect, start: Start) -> String {
    format!(
        "SELECT c.changed_at, c.parent_id, c.sequence, {reached} AS hit, {IN_FLIGHT} AS in_flight FROM child c {index} \
         WHERE c.state = 'pending' AND c.available_at IS NULL {below} {ORDER} LIMIT $4",
        index = (d.indexed_by)("child_pending_changed"),
        reached = reached(d, "c.parent_id"),
        below = below(start, "c.changed_at", "c.parent_id"),
    )
}

/// Given-back children (released, or their lease ran out), always pending,
/// across parents (`child_given_back`).
fn given_back_rows(d: &Dialect, start: Start) -> String {
    format!(
        "SELECT {ROW_COLUMNS} FROM child c {index} \
         WHERE c.state = 'pending' AND c.available_at IS NOT NULL {below} {ORDER} LIMIT $4",
        index = (d.indexed_by)("child_given_back"),
        below = below(start, "c.changed_at", "c.parent_id"),
    )
}

/// `given_back_rows` as keys, each saying whether it is in the queue and scope.
fn given_back_keys(d: &Dialect, start: Start) -> String {
    format!(
        "SELECT c.changed_at, c.parent_id, c.sequence, {reached} AS hit, false AS in_flight FROM child c {index} \
         WHERE c.state = 'pending' AND c.available_at IS NOT NULL {below} {ORDER} LIMIT $4",
        index = (d.indexed_by)("child_given_back"),
        reached = reached(d, "c.parent_id"),
        below = below(start, "c.changed_at", "c.parent_id"),
    )
}

/// One parent's given-back children (`child_given_back_by_parent`).
fn given_back_of_parent(d: &Dialect, start: Start) -> String {
    format!(
        "SELECT {ROW_COLUMNS} FROM child c {index} \
         WHERE c.parent_id = $3 AND c.state = 'pending' AND c.available_at IS NOT NULL {below} \
         {ORDER_IN_PARENT} LIMIT $4",
        index = (d.indexed_by)("child_given_back_by_parent"),
        below = below_in_parent(start, "c.changed_at", "c.sequence"),
    )
}

/// One parent's never-claimed children: pending, no `available_at`, at or
/// past its lane's floor `$5`. When its children were written in sequence
/// order (`in_order`: `changed_at` never falls as the sequence rises) the
/// search's order is the sequence's, read backwards in the primary key, and
/// a position of the parent's own is a sequence; otherwise the rows past the
/// floor are sorted.
fn never_claimed_of_parent(in_order: bool, start: Start) -> String {
    let (below, order) = match (in_order, start) {
        (true, Start::Own) => (
            "AND ($1 IS NULL OR true) AND c.sequence < $2".to_owned(),
            "ORDER BY c.sequence DESC",
        ),
        (true, _) => (
            below_in_parent(start, "c.changed_at", "c.sequence"),
            "ORDER BY c.sequence DESC",
        ),
        (false, _) => (below_in_parent(start, "c.changed_at", "c.sequence"), ORDER_IN_PARENT),
    };
    format!(
        "SELECT {ROW_COLUMNS} FROM child c \
         WHERE c.parent_id = $3 AND c.sequence >= $5 AND c.state = 'pending' AND c.available_at IS NULL \
         {below} {order} LIMIT $4"
    )
}

/// The ways of starting a read, by index (`Start::index`).
const STARTS: [Start; 3] = [Start::Top, Start::Below, Start::Own];

/// The settled states, by index (`settled`).
const SETTLED: [ChildState; 4] = [
    ChildState::Processed,
    ChildState::Failed,
    ChildState::Skipped,
    ChildState::Held,
];

/// The index of a statement of settled state `state` starting as `start`
/// in the sets below.
pub(super) fn settled(state: ChildState, start: Start) -> usize {
    let state = SETTLED.iter().position(|s| *s == state).unwrap_or(3);
    state * STARTS.len() + start.index()
}

/// The index of a statement starting as `start` in the sets below.
pub(super) fn starting(start: Start) -> usize {
    start.index()
}

fn settled_of(i: usize) -> (ChildState, Start) {
    (SETTLED[i / STARTS.len()], STARTS[i % STARTS.len()])
}

pub(super) static SETTLED_ROWS: SqlSet<12> = SqlSet::new(|d, i| {
    let (state, start) = settled_of(i);
    settled_rows(d, state, start)
});
pub(super) static SETTLED_KEYS: SqlSet<12> = SqlSet::new(|d, i| {
    let (state, start) = settled_of(i);
    settled_keys(d, state, start)
});
pub(super) static SETTLED_OF_PARENT: SqlSet<12> = SqlSet::new(|d, i| {
    let (state, start) = settled_of(i);
    settled_of_parent(d, state, start)
});
pub(super) static LEASED_ROWS: SqlSet<3> = SqlSet::new(|d, i| leased(d, STARTS[i], false, false));
pub(super) static LEASED_KEPT: SqlSet<3> = SqlSet::new(|d, i| leased(d, STARTS[i], false, true));
pub(super) static LEASED_OF_PARENT: SqlSet<3> = SqlSet::new(|d, i| leased(d, STARTS[i], true, false));
pub(super) static PENDING_ROWS: SqlSet<3> = SqlSet::new(|d, i| pending_rows(d, STARTS[i]));
pub(super) static PENDING_KEYS: SqlSet<3> = SqlSet::new(|d, i| pending_keys(d, STARTS[i]));
pub(super) static GIVEN_BACK_ROWS: SqlSet<3> = SqlSet::new(|d, i| given_back_rows(d, STARTS[i]));
pub(super) static GIVEN_BACK_KEYS: SqlSet<3> = SqlSet::new(|d, i| given_back_keys(d, STARTS[i]));
pub(super) static GIVEN_BACK_OF_PARENT: SqlSet<3> = SqlSet::new(|d, i| given_back_of_parent(d, STARTS[i]));
pub(super) static NEVER_CLAIMED_IN_ORDER: SqlSet<3> = SqlSet::new(|_, i| never_claimed_of_parent(true, STARTS[i]));
pub(super) static NEVER_CLAIMED_SORTED: SqlSet<3> = SqlSet::new(|_, i| never_claimed_of_parent(false, STARTS[i]));

/// Whole rows of the children named by keys: JSON text `$1`, an array of
/// `[sequence, parent_id]` pairs (`Dialect::json_pairs`), each as readers see it.
pub(super) static ROWS_OF_KEYS: Sql = Sql::new(|d| {
    format!(
        "SELECT {} FROM {} WHERE (c.parent_id, c.sequence) IN (SELECT t, n FROM ({}) k)",
        sql::child_columns(d),
        sql::child_view(d),
        (d.json_pairs)("$1")
    )
});

/// How `CANDIDATES` picks parents.
#[derive(Debug, Clone, Copy)]
pub(super) enum By {
    /// The parent `$1` (if in queue `$2`, when one is given).
    Parent,
    /// The parents of queue `$2`.
    Queue,
    /// Every parent the scope reaches.
    Scope,
}

/// The index of a candidates statement in `CANDIDATES`: picking parents
/// `by`, and with `state`, only those whose projection has children in it.
pub(super) fn candidates_of(by: By, state: Option<ChildState>) -> usize {
    let having = state.map_or(0, |s| 1 + ChildState::ALL.iter().position(|a| *a == s).unwrap_or(0));
    by as usize * (ChildState::ALL.len() + 1) + having
}

/// The parents a filtered search reads one by one, in the scope `$3`: with
/// their lane's floor and whether their children were written in order;
/// `$4` how many at most. See `candidates_of`.
pub(super) static CANDIDATES: SqlSet<21> = SqlSet::new(|d, i| {
    let per_by = ChildState::ALL.len() + 1;
    let by = match i / per_by {
        0 => "p.parent_id = $1 AND ($2 IS NULL OR p.queue = $2)",
        1 => "($1 IS NULL OR true) AND p.queue = $2",
        _ => "($1 IS NULL OR true) AND ($2 IS NULL OR true)",
    };
    let having = match (i % per_by).checked_sub(1).map(|s| ChildState::ALL[s]) {
        None => String::new(),
        Some(ChildState::Processed) => "AND p.processed > 0".to_owned(),
        Some(ChildState::Failed) => "AND p.failed > 0".to_owned(),
        Some(ChildState::Skipped) => "AND p.skipped > 0".to_owned(),
        Some(ChildState::Held) => format!("AND {} > 0", sql::OPEN_HELD),
        Some(ChildState::InFlight) => format!("AND {} > 0", sql::OPEN_IN_FLIGHT),
        Some(ChildState::Pending) => format!("AND {} > 0", sql::open_pending()),
    };
    format!(
        "SELECT p.parent_id, p.children_in_order, l.floor, l.parent_id IS NOT NULL AS has_lane \
         FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id \
         WHERE {by} AND {within} {having} ORDER BY p.parent_id LIMIT $4",
        within = (d.within)("$3"),
    )
});
