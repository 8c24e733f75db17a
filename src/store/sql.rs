//! The ledger rules a statement must express in SQL, each next to the Rust
//! rule it mirrors (tested to agree on the same rows, below), and the column
//! lists and fragments that statements of both dialects are built from.

use std::sync::LazyLock;

use super::statement::Dialect;

/// `Tally::is_complete` in SQL: a parent completes when it is decomposed and
/// every child is terminal. `decomposed` is a boolean expression; `terminal`
/// and `total` are counts.
pub(crate) fn complete(decomposed: &str, terminal: &str, total: &str) -> String {
    format!("({decomposed} AND {terminal} >= {total})")
}

/// `Tolerance::crossed` in SQL: whether `failed` children of `total` are
/// more than a parent's stored tolerance (`count`, `percent`: its columns,
/// at most one set; neither: never crossed) tolerates. `failed` may be an
/// expression (`p.failed - d.failed`): it is parenthesized, so the
/// percentage multiplies all of it.
pub(crate) fn crossed(count: &str, percent: &str, failed: &str, total: &str) -> String {
    format!(
        "(({count} IS NOT NULL AND ({failed}) > {count}) \
          OR ({count} IS NULL AND {percent} IS NOT NULL AND ({failed}) * 100.0 > {percent} * {total}))"
    )
}

/// `crossed` over a parent row aliased `alias`, for `failed` failed children.
pub(crate) fn parent_crossed(alias: &str, failed: &str) -> String {
    crossed(
        &format!("{alias}.tolerated_count"),
        &format!("{alias}.tolerated_percent"),
        failed,
        &format!("{alias}.total"),
    )
}

/// `complete` over a parent row's own stored projection, aliased `alias`.
pub(crate) fn parent_complete(alias: &str) -> String {
    complete(
        &format!("{alias}.decomposed_at IS NOT NULL"),
        &format!("{alias}.processed + {alias}.failed + {alias}.skipped"),
        &format!("{alias}.total"),
    )
}

/// A child's claim as readers see it, as SQL expressions over the row: its
/// attempts, its claim and the one before. The row counts only the attempts
/// that ended (`claim_id` made the last one, `previous_claim_id` the one
/// before); a live lease adds its own (see `child_view`).
pub(crate) struct ClaimView {
    pub attempts: String,
    pub claim_id: String,
    pub previous_claim_id: String,
}

impl ClaimView {
    /// The view of child row `c` that is in flight when `leased` holds, under
    /// the lease of claim `holder`.
    pub fn of(leased: &str, holder: &str) -> Self {
        Self {
            attempts: format!("(c.attempts + CASE WHEN {leased} THEN 1 ELSE 0 END)"),
            claim_id: format!("(CASE WHEN {leased} THEN {holder} ELSE c.claim_id END)"),
            previous_claim_id: format!("(CASE WHEN {leased} THEN c.claim_id ELSE c.previous_claim_id END)"),
        }
    }
}

/// Whether child row `c` is in flight: pending, not given back (no
/// `available_at`), and below `floor`, its lane's floor (NULL: every child
/// was taken), on a parent that `has_lane` (migration 0014).
pub(crate) fn leased(floor: &str, has_lane: &str) -> String {
    format!("(c.state = 'pending' AND c.available_at IS NULL AND {has_lane} AND coalesce(c.sequence < {floor}, true))")
}

/// `ledger::outcome::attempt_of` in SQL: the attempt a claim id names on a
/// child (its current claim, or the one before), else NULL.
pub(crate) fn attempt_of(claim: &str, v: &ClaimView) -> String {
    format!(
        "CASE WHEN {claim} = {} THEN {a} WHEN {claim} = {} THEN {a} - 1 END",
        v.claim_id,
        v.previous_claim_id,
        a = v.attempts
    )
}

/// `ledger::outcome::fence_admits` in SQL: whether a write with claim id
/// `claim` may record a child's outcome (no claim id, or the child's current
/// claim, or the one before). NULL counts as no.
pub(crate) fn fence_admits(claim: &str, v: &ClaimView) -> String {
    format!(
        "coalesce({claim} IS NULL OR {claim} = {} OR {claim} = {}, false)",
        v.claim_id, v.previous_claim_id
    )
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
/// is credited to. A write without a claim id is credited to the current
/// attempt, if the child was ever claimed.
pub(crate) fn credited_attempt(claim: &str, v: &ClaimView) -> String {
    format!(
        "CASE WHEN {claim} IS NULL THEN NULLIF({}, 0) ELSE {} END",
        v.attempts,
        attempt_of(claim, v)
    )
}

/// Whether child row `c` of `child_view` was recorded processed without
/// being rewritten (migration 0023 on Postgres, 0022 on SQLite): it looks in flight (pending,
/// not given back, below its lane's floor) but no lease holds it, as the
/// outcome that recorded it took it out of its lease. Its outcome batch
/// says the rest (`Dialect::quiet_batch`).
pub(crate) fn quiet_in_view() -> String {
    format!(
        "(h.claim_id IS NULL AND {})",
        leased("ln.floor", "ln.parent_id IS NOT NULL")
    )
}

/// `quiet_in_view` for a child row `c` that looks in flight when `leased`
/// holds (`sql::leased` over its lane), the leases that might hold it
/// looked up.
pub(crate) fn quiet_with(d: &Dialect, leased: &str) -> String {
    format!("({leased} AND NOT {})", lease_holds_row(d))
}

/// How many children of parent `parent` are in flight: listed by a lease,
/// their rows pending and below their lane's floor.
/// Read from the leases, so a count of a parent's rows subtracts it from
/// those that look in flight to learn how many were recorded without being
/// rewritten (`quiet_with`): a lookup per in-flight child, not one per
/// recorded child (six times the count's own time at 80% recorded).
pub(crate) fn listed_in_flight(d: &Dialect, parent: &str) -> String {
    format!(
        "(SELECT count(DISTINCT ls.value) FROM claim_lease l CROSS JOIN {sequences} \
             JOIN child c ON c.parent_id = l.parent_id AND c.sequence = ls.value \
             LEFT JOIN lane ln ON ln.parent_id = l.parent_id \
          WHERE l.parent_id = {parent} AND {leased})",
        sequences = (d.lease_sequences)("l"),
        leased = leased("ln.floor", "ln.parent_id IS NOT NULL")
    )
}

/// `quiet_with` for a child row `c` read alone, its lane looked up.
pub(crate) fn quiet_row(d: &Dialect) -> String {
    quiet_with(d, &leased_row())
}

/// `leased` for a child row `c` read alone.
pub(crate) fn leased_row() -> String {
    leased(
        "(SELECT floor FROM lane WHERE lane.parent_id = c.parent_id)",
        "EXISTS (SELECT 1 FROM lane WHERE lane.parent_id = c.parent_id)",
    )
}

/// Whether a lease of child row `c`'s parent lists it.
fn lease_holds_row(d: &Dialect) -> String {
    format!(
        "EXISTS (SELECT 1 FROM claim_lease l WHERE l.parent_id = c.parent_id \
            AND l.lo <= c.sequence AND l.hi >= c.sequence AND {})",
        (d.lease_holds)("l", "c.sequence")
    )
}

/// A child row `c`'s state as readers see it, the row read alone (an
/// in-flight child shows its row's `pending`).
pub(crate) fn row_state(d: &Dialect) -> String {
    format!("CASE WHEN {} THEN 'processed' ELSE c.state END", quiet_row(d))
}

/// A child's state as readers see it, in `child_view`.
pub(crate) fn view_state() -> String {
    format!(
        "CASE WHEN h.claim_id IS NOT NULL THEN 'in_flight' WHEN {} THEN 'processed' ELSE c.state END",
        quiet_in_view()
    )
}

/// Whether child row `c` of `child_view` may be in state `state` (a
/// parameter) as readers see it (`view_state`), from the row and its lane
/// alone: a filter that passes over children below the floor, in flight or
/// recorded, before their leases are looked up.
pub(crate) fn may_be_in(state: &str) -> String {
    let leased = leased("ln.floor", "ln.parent_id IS NOT NULL");
    format!(
        "(CASE WHEN {state} = 'pending' THEN c.state = 'pending' AND NOT {leased} \
              WHEN {state} = 'in_flight' THEN {leased} \
              WHEN {state} = 'processed' THEN c.state = 'processed' OR {leased} \
              ELSE c.state = {state} END)"
    )
}

/// The attempt a child's outcome is credited to, as readers see it, in `child_view`.
pub(crate) fn view_outcome_attempt() -> String {
    outcome_attempt_of(&quiet_in_view())
}

/// When a child became terminal, as readers see it, in `child_view`.
pub(crate) fn view_terminal_at(d: &Dialect) -> String {
    terminal_at_of(&quiet_in_view(), &(d.quiet_batch)("changed_at"))
}

/// `view_outcome_attempt` of row `c`, recorded quietly when `quiet` holds.
fn outcome_attempt_of(quiet: &str) -> String {
    format!("CASE WHEN {quiet} THEN c.attempts + 1 ELSE c.outcome_attempt END")
}

/// `view_terminal_at` of row `c`, recorded quietly at `at` when `quiet` holds.
fn terminal_at_of(quiet: &str, at: &str) -> String {
    format!("CASE WHEN {quiet} THEN {at} ELSE c.terminal_at END")
}

/// A child's columns as `Child` reads them, from `child_view`: the row, the
/// lease `h` that holds it while it is in flight, and the outcome batch of
/// a child recorded without its row rewritten (`quiet_in_view`).
pub(crate) fn child_columns(d: &Dialect) -> String {
    child_columns_of(
        "h.claim_id IS NOT NULL",
        &|column| format!("h.{column}"),
        &quiet_in_view(),
        &|column| (d.quiet_batch)(column),
    )
}

/// A child's columns as `Child` reads them, from its row `c`: in flight when
/// `held` (its lease's columns `lease(column)`), recorded without its row
/// rewritten when `quiet` (its outcome batch's columns `batch(column)`),
/// else as the row says.
pub(crate) fn child_columns_of(
    held: &str,
    lease: &dyn Fn(&str) -> String,
    quiet: &str,
    batch: &dyn Fn(&str) -> String,
) -> String {
    let either = |leased: String, batched: String, row: &str| {
        format!("CASE WHEN {held} THEN {leased} WHEN {quiet} THEN {batched} ELSE {row} END")
    };
    format!(
        "c.parent_id, c.sequence, c.key, {state} AS state, c.payload, \
         c.attempts + CASE WHEN {held} OR {quiet} THEN 1 ELSE 0 END AS attempts, \
         {claim} AS claim_id, {worker} AS claimed_by, {expires} AS lease_expires_at, \
         c.previous_attempt, c.available_at, c.not_before, c.reason, c.result, {attempt} AS outcome_attempt, \
         {terminal} AS terminal_at, {changed} AS changed_at, \
         c.conflicts, c.conflict_count, c.redrive_of_parent, c.redrive_of_sequence",
        state = either("'in_flight'".to_owned(), "'processed'".to_owned(), "c.state"),
        claim = either(lease("claim_id"), batch("claim_id"), "c.claim_id"),
        worker = either(lease("worker"), batch("worker"), "c.claimed_by"),
        expires = either(lease("expires_at"), batch("expires_at"), "c.lease_expires_at"),
        attempt = outcome_attempt_of(quiet),
        terminal = terminal_at_of(quiet, &batch("changed_at")),
        changed = either(lease("claimed_at"), batch("changed_at"), "c.changed_at"),
    )
}

/// The tables `child_columns` reads, in dialect `d`: `child c`, its lane
/// `ln`, and its live lease `h` (none unless it is in flight), found by the
/// lease's range and then its list.
pub(crate) fn child_view(d: &Dialect) -> String {
    format!(
        "child c LEFT JOIN lane ln ON ln.parent_id = c.parent_id \
         LEFT JOIN claim_lease h ON {leased} AND h.parent_id = c.parent_id \
             AND h.lo <= c.sequence AND h.hi >= c.sequence AND {holds}",
        leased = leased("ln.floor", "ln.parent_id IS NOT NULL"),
        holds = (d.lease_holds)("h", "c.sequence")
    )
}

/// The claim of the lease that holds child row `c` (of a parent whose
/// lease rows are `claim_lease`), in dialect `d`; NULL when none does.
pub(crate) fn holder(d: &Dialect, column: &str) -> String {
    format!(
        "(SELECT l.{column} FROM claim_lease l WHERE l.parent_id = c.parent_id \
            AND l.lo <= c.sequence AND l.hi >= c.sequence AND {} LIMIT 1)",
        (d.lease_holds)("l", "c.sequence")
    )
}

/// Child row `c`'s claim as readers see it, for a statement that reads one
/// row of the child table (its lane and lease looked up).
pub(crate) fn conflict_view(d: &Dialect) -> ClaimView {
    // A child recorded without its row rewritten has no lease: its batch names its claim.
    let claim = format!("coalesce({}, {})", holder(d, "claim_id"), (d.quiet_batch)("claim_id"));
    ClaimView::of(&leased_row(), &claim)
}

/// A parent's open counts (`open_pending`, `open_in_flight`, `open_held`)
/// from its counters and its lane's, for `parent p LEFT JOIN lane l`: no count
/// over its children (migration 0009 says how each is kept).
pub(crate) static OPEN_COUNTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{OPEN_IN_FLIGHT} AS open_in_flight, {OPEN_HELD} AS open_held, {} AS open_pending",
        open_pending()
    )
});

/// A parent's children in flight, for `parent p LEFT JOIN lane l`.
pub(crate) const OPEN_IN_FLIGHT: &str = "(coalesce(l.claimed - l.unclaimed, 0) - p.settled_in_flight)";

/// A parent's held children, for `parent p LEFT JOIN lane l`.
pub(crate) const OPEN_HELD: &str = "(coalesce(l.held_in - l.held_out, 0) - p.settled_held)";

/// A parent's pending children, for `parent p LEFT JOIN lane l`.
pub(crate) fn open_pending() -> String {
    format!("(p.total - p.processed - p.failed - p.skipped - {OPEN_IN_FLIGHT} - {OPEN_HELD})")
}

/// A parent row's columns with its open counts.
pub(crate) static PARENT_SELECT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT p.parent_id, p.queue, p.payload, p.max_attempts, p.expired_lease, p.priority, p.webhook_url, \
             p.not_before, p.flow_key, p.backoff_initial, p.backoff_max, \
             p.total, p.processed, p.failed, p.skipped, p.created_at, p.decomposed_at, p.completed_at, \
             p.last_progress_at, p.position, p.tolerated_count, p.tolerated_percent, p.cancelled_at, p.redrive_of, \
             {open_counts} \
         FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id",
        open_counts = OPEN_COUNTS.as_str()
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

/// Returns a parent's held child `$2` (NULL: every held child) to pending,
/// given back (claimable now through its `available_at`, as a released
/// child is); `now` is the dialect's clock.
pub(crate) fn retry_held(now: &str) -> String {
    format!(
        "UPDATE child SET state = 'pending', available_at = {now}, changed_at = {now} \
         WHERE parent_id = $1 AND ($2 IS NULL OR sequence = $2) AND state = 'held'"
    )
}

/// Why each losing outcome write lost: for each `(parent_id, sequence)` of the
/// input, whether its parent is decomposed, the child's state (NULL when
/// missing) as readers see it, and whether the write passes the fence.
/// `input` is the dialect's table of `(i, parent_id, sequence, claim_id)`.
pub(crate) fn loser_facts(d: &Dialect, input: &str) -> String {
    // A child recorded without its row rewritten is seen as its claim left it.
    let quiet = quiet_in_view();
    let view = ClaimView::of(
        &format!("(h.claim_id IS NOT NULL OR {quiet})"),
        &format!(
            "CASE WHEN h.claim_id IS NOT NULL THEN h.claim_id ELSE {} END",
            (d.quiet_batch)("claim_id")
        ),
    );
    format!(
        "SELECT u.i, p.decomposed_at IS NOT NULL, \
             {state}, {fence} FROM {input} \
         LEFT JOIN parent p ON p.parent_id = u.parent_id \
         LEFT JOIN ({from}) ON c.parent_id = u.parent_id AND c.sequence = u.sequence",
        fence = fence_admits("u.claim_id", &view),
        state = view_state(),
        from = child_view(d)
    )
}

/// The delay in seconds of a child handed out again after `attempts`
/// attempts ended (an expression), by parent `p`'s `retry_backoff`:
/// `RetryBackoff::ceiling` times `random` (the dialect's random fraction in
/// [0, 1): full jitter); 0 without a backoff.
pub(crate) fn backoff_seconds(random: &str, p: &str, attempts: &str) -> String {
    let ceiling = format!(
        "{p}.backoff_initial * (1 << (CASE WHEN {attempts} > 31 THEN 30 WHEN {attempts} < 1 THEN 0 \
             ELSE {attempts} - 1 END))"
    );
    format!("coalesce(CASE WHEN {ceiling} > {p}.backoff_max THEN {p}.backoff_max ELSE {ceiling} END * {random}, 0)")
}

#[cfg(test)]
mod tests;
