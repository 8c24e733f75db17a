//! The words Postgres writes its shared statements with (`Dialect`), and the
//! SQL fragments its own statements share.

use crate::store::sql;
use crate::store::statement::Dialect;

/// The words Postgres writes its shared statements with.
pub(super) static POSTGRES: Dialect = Dialect {
    slot: 0,
    now: "now()",
    statement_now: "statement_timestamp()",
    minute: MINUTE,
    epoch: "CAST(extract(epoch FROM now()) AS float8)",
    for_update: " FOR UPDATE",
    unflushed_commit: Some("set_config('synchronous_commit', 'off', true)"),
    skip_locked: " FOR UPDATE SKIP LOCKED",
    flow_served: "nextval('flow_limit_served')",
    greatest: "greatest",
    later: |p| format!("(now() + make_interval(secs => {p}))"),
    ago: |p| format!("(now() - make_interval(secs => {p}))"),
    as_time: |p| format!("CAST({p} AS timestamptz)"),
    json: |p| format!("{p}::json"),
    json_push: |column, p| format!("{column} || jsonb_build_array({p}::jsonb)"),
    json_length: |column| format!("jsonb_array_length({column})"),
    json_bytes: |column| format!("octet_length({column}::text)"),
    lease_sequences: |l| format!("unnest({}) AS ls(value)", listed(l)),
    lease_holds: lists,
    quiet_batch: |column| {
        format!(
            "(SELECT q.{column} FROM processed_batch q WHERE q.parent_id = c.parent_id AND q.claim_id IS NOT NULL \
                AND q.hi >= c.sequence AND q.lo <= c.sequence \
                AND {} ORDER BY q.hi LIMIT 1)",
            lists("q", "c.sequence")
        )
    },
    json_pairs: |p| format!("SELECT (e->>0)::bigint AS n, e->>1 AS t FROM json_array_elements({p}::json) AS e"),
    json_texts: |p| format!("SELECT json_array_elements_text({p}::json)"),
    indexed_by: |_| String::new(),
    within: sql::within_postgres,
};

/// The sequences claim lease `l` lists. A lease of every sequence from its
/// `lo` to its `hi` (a claim from the floor up, usually) keeps no list
/// (`sequences` is NULL): a list of 500 was toasted and compressed by every
/// claim, and read back by every outcome.
pub(super) fn listed(l: &str) -> String {
    format!("coalesce({l}.sequences, ARRAY(SELECT generate_series({l}.lo, {l}.hi)))")
}

/// Whether lease (or outcome batch) `l`'s list names child `sequence`: a
/// row without a list names every sequence from its `lo` to its `hi`.
fn lists(l: &str, sequence: &str) -> String {
    format!("({l}.sequences IS NULL OR {sequence} = ANY ({l}.sequences))")
}

/// The current minute since the epoch, by the database clock.
pub(super) const MINUTE: &str = "(floor(extract(epoch FROM now()) / 60))::bigint";

/// A `reasons` CTE: adds the children that `rows (parent_id, state, reason)`
/// made failed or skipped to their parents' reason counts (`child_reason`,
/// migration 0019), one row version per parent, state and reason per
/// statement. Every update that makes a child failed or skipped names it
/// (an outcome batch, an expiry that exhausts the attempts, a parent's skips;
/// migration 0022 dropped the trigger that did it for every update, outcomes
/// of `processed` included); no update takes a child out of those states.
pub(super) fn count_reasons(rows: &str) -> String {
    format!(
        "reasons AS ( \
             INSERT INTO child_reason AS r (parent_id, state, reason_null, reason, n) \
             SELECT parent_id, state, reason IS NULL, coalesce(reason, ''), count(*) FROM {rows} \
             WHERE state IN ('failed', 'skipped') GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4 \
             ON CONFLICT (parent_id, state, reason_null, md5(reason)) DO UPDATE SET n = r.n + excluded.n)"
    )
}
