-- A processed child's row is no longer rewritten when the claim that holds
-- it records it (issue 28; the Postgres migration 0023 did it there). The
-- outcome takes the child out of its lease's list and names it in an
-- outcome batch of its own, with the claim, its worker and when their lease
-- would have run out; the row stays as the claim found it. A pending row
-- below its lane's floor, not given back, that no lease lists is such a
-- child: readers show it processed, with what its batch says
-- (`sql::child_view`), and every writer leaves it alone. The rewrite was
-- about a quarter of SQLite's work per child: `state` and `changed_at` are
-- in every partial index on `child`.

-- A child's batch, for a reader that finds its row pending and no lease
-- holding it.
CREATE INDEX processed_batch_quiet ON processed_batch (parent_id, hi) WHERE claim_id IS NOT NULL;

-- Children as readers see them, for operators' SQL: a child recorded without
-- its row rewritten shows as processed, with what its batch says. A batch of
-- every sequence from its `lo` to its `hi` says so by its length.
DROP VIEW child_status;
CREATE VIEW child_status AS
SELECT v.parent_id, v.sequence, v.key,
    CASE WHEN v.lease_claim IS NOT NULL THEN 'in_flight' WHEN v.quiet THEN 'processed' ELSE v.state END AS state,
    v.payload, v.attempts + CASE WHEN v.lease_claim IS NOT NULL OR v.quiet THEN 1 ELSE 0 END AS attempts,
    coalesce(v.lease_claim, b.claim_id, v.claim_id) AS claim_id,
    CASE WHEN v.lease_claim IS NOT NULL THEN v.lease_worker WHEN v.quiet THEN b.worker ELSE v.claimed_by END
        AS claimed_by,
    CASE WHEN v.lease_claim IS NOT NULL THEN v.lease_expires WHEN v.quiet THEN b.expires_at
         ELSE v.lease_expires_at END AS lease_expires_at,
    v.previous_attempt, v.available_at, v.reason, v.result,
    CASE WHEN v.quiet THEN v.attempts + 1 ELSE v.outcome_attempt END AS outcome_attempt,
    CASE WHEN v.quiet THEN b.changed_at ELSE v.terminal_at END AS terminal_at,
    CASE WHEN v.lease_claim IS NOT NULL THEN v.lease_claimed WHEN v.quiet THEN b.changed_at ELSE v.changed_at END
        AS changed_at,
    v.conflicts, v.conflict_count
FROM (
    SELECT c.parent_id, c.sequence, c.key, c.state, c.payload, c.attempts, c.claim_id, c.claimed_by,
        c.lease_expires_at, c.previous_attempt, c.available_at, c.reason, c.result, c.outcome_attempt,
        c.terminal_at, c.changed_at, c.conflicts, c.conflict_count,
        h.claim_id AS lease_claim, h.worker AS lease_worker, h.expires_at AS lease_expires,
        h.claimed_at AS lease_claimed,
        h.claim_id IS NULL AND c.state = 'pending' AND c.available_at IS NULL AND ln.parent_id IS NOT NULL
            AND coalesce(c.sequence < ln.floor, 1) AS quiet
    FROM child c
    LEFT JOIN lane ln ON ln.parent_id = c.parent_id
    LEFT JOIN claim_lease h ON c.state = 'pending' AND c.available_at IS NULL AND ln.parent_id IS NOT NULL
        AND coalesce(c.sequence < ln.floor, 1) AND h.parent_id = c.parent_id
        AND h.lo <= c.sequence AND h.hi >= c.sequence
        AND EXISTS (SELECT 1 FROM json_each(h.sequences) WHERE value = c.sequence)) v
LEFT JOIN processed_batch b ON v.quiet AND b.rowid = (
    SELECT q.rowid FROM processed_batch q
    WHERE q.parent_id = v.parent_id AND q.claim_id IS NOT NULL AND q.hi >= v.sequence AND q.lo <= v.sequence
      AND (json_array_length(q.sequences) = q.hi - q.lo + 1
           OR EXISTS (SELECT 1 FROM json_each(q.sequences) WHERE value = v.sequence))
    ORDER BY q.hi LIMIT 1);
