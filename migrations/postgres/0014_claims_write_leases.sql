-- A claim writes its lease, not its children. Until now a claim rewrote every
-- child it handed out (state, claim id, worker, lease expiry, attempts): a
-- new row version and an index entry per child, half the ledger's write work.
-- Now the child row stays as it was registered until the child's outcome
-- (or the end of its lease without one); what the claim knows lives in its
-- `claim_lease` row, and the lane's `floor` says which children it covers:
--
--   a child is in flight  <=>  its row is `pending`, it has no `available_at`,
--                              and its sequence is below its lane's `floor`
--                              (every such child is in exactly one lease).
--
-- `floor` now only moves up: it is the next child no claim has taken. A child
-- whose lease ends without an outcome (released, expired, a held child
-- retried) is given an `available_at` and comes back through `child_delayed`;
-- the claim that takes it again clears it. The child row records, at the end
-- of each attempt, which claim made it (`claim_id`, and the one before in
-- `previous_claim_id`) and how many attempts ended (`attempts`); a reader
-- adds the live lease (`store::sql::CHILD_VIEW`).
--
-- `claim_lease` gains the claim's `worker`, `open` (how many of its children
-- have neither an outcome nor been released: the row goes when it reaches 0)
-- and `lo`/`hi`, its lowest and highest sequence (a reader finds a child's
-- lease by them).
ALTER TABLE claim_lease
    ADD COLUMN worker text,
    ADD COLUMN open integer NOT NULL DEFAULT 0,
    ADD COLUMN lo bigint NOT NULL DEFAULT 0,
    ADD COLUMN hi bigint NOT NULL DEFAULT 0;

DELETE FROM claim_lease;
INSERT INTO claim_lease (claim_id, parent_id, sequences, expires_at, claimed_at, worker, open, lo, hi)
SELECT claim_id, parent_id, array_agg(sequence ORDER BY sequence), max(lease_expires_at), max(changed_at),
    max(claimed_by), count(*), min(sequence), max(sequence)
FROM child WHERE state = 'in_flight' AND claim_id IS NOT NULL
GROUP BY claim_id, parent_id;
CREATE INDEX claim_lease_parent ON claim_lease (parent_id, lo);

-- Each lane's floor rises past its in-flight children; the pending children
-- it passes come back through `available_at`.
CREATE TEMPORARY TABLE lane_past ON COMMIT DROP AS
SELECT parent_id, max(sequence) + 1 AS past FROM child WHERE state = 'in_flight' GROUP BY parent_id;
UPDATE child c SET available_at = now()
FROM lane_past t WHERE c.parent_id = t.parent_id AND c.state = 'pending' AND c.available_at IS NULL
  AND c.sequence < t.past;
UPDATE lane l SET
    floor = (SELECT min(c.sequence) FROM child c
             WHERE c.parent_id = l.parent_id AND c.state = 'pending' AND c.available_at IS NULL
               AND c.sequence >= t.past),
    ready_at = (SELECT min(c.available_at) FROM child c
                WHERE c.parent_id = l.parent_id AND c.state = 'pending' AND c.available_at IS NOT NULL)
FROM lane_past t WHERE l.parent_id = t.parent_id AND (l.floor IS NOT NULL OR l.ready_at IS NOT NULL);
UPDATE child SET state = 'pending', attempts = greatest(attempts - 1, 0), claim_id = previous_claim_id,
    previous_claim_id = NULL, claimed_by = NULL, lease_expires_at = NULL
WHERE state = 'in_flight';

-- A claim reads a lane's children from its floor up in the primary key: past
-- the floor no child has been claimed, so the per-parent index of pending
-- children is an entry per child that nothing needs.
DROP INDEX child_pending;

-- Children are written only with their parent, in the transaction that
-- registers or appends them, and deleted before it (the pruner's order); the
-- foreign key's check cost a lookup and a trigger per registered child.
ALTER TABLE child DROP CONSTRAINT child_parent_id_fkey;

-- Children as the service shows them, for operators who inspect with SQL: a
-- child in flight shows `in_flight`, its live lease's claim, worker and expiry.
CREATE VIEW child_status AS
SELECT c.parent_id, c.sequence, c.key,
    CASE WHEN h.claim_id IS NULL THEN c.state ELSE 'in_flight' END AS state,
    c.payload, c.attempts + CASE WHEN h.claim_id IS NULL THEN 0 ELSE 1 END AS attempts,
    coalesce(h.claim_id, c.claim_id) AS claim_id,
    CASE WHEN h.claim_id IS NULL THEN c.claimed_by ELSE h.worker END AS claimed_by,
    CASE WHEN h.claim_id IS NULL THEN c.lease_expires_at ELSE h.expires_at END AS lease_expires_at,
    c.previous_attempt, c.available_at, c.reason, c.result, c.outcome_attempt, c.terminal_at,
    CASE WHEN h.claim_id IS NULL THEN c.changed_at ELSE h.claimed_at END AS changed_at,
    c.conflicts, c.conflict_count
FROM child c
LEFT JOIN lane ln ON ln.parent_id = c.parent_id
LEFT JOIN claim_lease h ON c.state = 'pending' AND c.available_at IS NULL AND ln.parent_id IS NOT NULL
    AND coalesce(c.sequence < ln.floor, true) AND h.parent_id = c.parent_id
    AND h.lo <= c.sequence AND h.hi >= c.sequence AND c.sequence = ANY (h.sequences);
