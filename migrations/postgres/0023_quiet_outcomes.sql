-- A processed child's row is no longer rewritten when the claim that holds
-- it records it (issue 28). The outcome takes the child out of its lease and
-- names it in an outcome batch of its own, which says which claim and worker
-- recorded it and when their lease would have run out; the row stays as the
-- claim found it. A pending row below its lane's floor, not given back, that
-- no lease holds is such a child: readers show it processed, with what its
-- batch says (`sql::child_view`), and every writer leaves it alone. Batches
-- without a claim name children whose rows were written, as before. The
-- rewrite was about 7 µs of the database's CPU per child, a fifth of all of
-- it, and 500 bytes of WAL.
ALTER TABLE processed_batch
    ADD COLUMN claim_id   uuid,
    ADD COLUMN worker     text,
    ADD COLUMN expires_at timestamptz;
-- A child's batch, for a reader that finds its row pending and no lease
-- holding it.
CREATE INDEX processed_batch_quiet ON processed_batch (parent_id, hi) WHERE claim_id IS NOT NULL;

-- Children as readers see them, for operators' SQL: a child recorded without
-- its row rewritten shows as processed, with what its batch says.
CREATE OR REPLACE VIEW child_status AS
SELECT c.parent_id, c.sequence, c.key,
    CASE WHEN h.claim_id IS NOT NULL THEN 'in_flight' WHEN q.quiet THEN 'processed' ELSE c.state END AS state,
    c.payload, c.attempts + CASE WHEN h.claim_id IS NOT NULL OR q.quiet THEN 1 ELSE 0 END AS attempts,
    coalesce(h.claim_id, b.claim_id, c.claim_id) AS claim_id,
    CASE WHEN h.claim_id IS NOT NULL THEN h.worker WHEN q.quiet THEN b.worker ELSE c.claimed_by END AS claimed_by,
    CASE WHEN h.claim_id IS NOT NULL THEN h.expires_at WHEN q.quiet THEN b.expires_at ELSE c.lease_expires_at END
        AS lease_expires_at,
    c.previous_attempt, c.available_at, c.reason, c.result,
    CASE WHEN q.quiet THEN c.attempts + 1 ELSE c.outcome_attempt END AS outcome_attempt,
    CASE WHEN q.quiet THEN b.changed_at ELSE c.terminal_at END AS terminal_at,
    CASE WHEN h.claim_id IS NOT NULL THEN h.claimed_at WHEN q.quiet THEN b.changed_at ELSE c.changed_at END
        AS changed_at,
    c.conflicts, c.conflict_count
FROM child c
LEFT JOIN lane ln ON ln.parent_id = c.parent_id
LEFT JOIN claim_lease h ON c.state = 'pending' AND c.available_at IS NULL AND ln.parent_id IS NOT NULL
    AND coalesce(c.sequence < ln.floor, true) AND h.parent_id = c.parent_id
    AND h.lo <= c.sequence AND h.hi >= c.sequence
    AND (h.sequences IS NULL OR c.sequence = ANY (h.sequences))
CROSS JOIN LATERAL (
    SELECT h.claim_id IS NULL AND c.state = 'pending' AND c.available_at IS NULL AND ln.parent_id IS NOT NULL
        AND coalesce(c.sequence < ln.floor, true) AS quiet) q
LEFT JOIN LATERAL (
    SELECT b.claim_id, b.worker, b.expires_at, b.changed_at FROM processed_batch b
    WHERE q.quiet AND b.parent_id = c.parent_id AND b.claim_id IS NOT NULL
      AND b.hi >= c.sequence AND b.lo <= c.sequence
      AND (b.sequences IS NULL OR c.sequence = ANY (b.sequences))
    ORDER BY b.hi LIMIT 1) b ON true;
