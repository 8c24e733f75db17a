-- A claim writes its lease, not its children (see the Postgres migration
-- 0014): a child is in flight when its row is `pending`, it has no
-- `available_at` and its sequence is below its lane's `floor`; its lease row
-- names it. `claim_lease` gains `worker`, `open` and `lo`/`hi`.
ALTER TABLE claim_lease ADD COLUMN worker TEXT;
ALTER TABLE claim_lease ADD COLUMN open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE claim_lease ADD COLUMN lo INTEGER NOT NULL DEFAULT 0;
ALTER TABLE claim_lease ADD COLUMN hi INTEGER NOT NULL DEFAULT 0;

DELETE FROM claim_lease;
INSERT INTO claim_lease (claim_id, parent_id, sequences, expires_at, claimed_at, worker, open, lo, hi)
SELECT claim_id, parent_id, json_group_array(sequence), max(lease_expires_at), max(changed_at),
    max(claimed_by), count(*), min(sequence), max(sequence)
FROM (SELECT * FROM child WHERE state = 'in_flight' AND claim_id IS NOT NULL ORDER BY sequence)
GROUP BY claim_id, parent_id;
CREATE INDEX claim_lease_parent ON claim_lease (parent_id, lo);

CREATE TEMPORARY TABLE lane_past AS
SELECT parent_id, max(sequence) + 1 AS past FROM child WHERE state = 'in_flight' GROUP BY parent_id;
UPDATE child SET available_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE state = 'pending' AND available_at IS NULL
  AND sequence < (SELECT t.past FROM lane_past t WHERE t.parent_id = child.parent_id);
UPDATE lane SET
    floor = (SELECT min(c.sequence) FROM child c
             WHERE c.parent_id = lane.parent_id AND c.state = 'pending' AND c.available_at IS NULL
               AND c.sequence >= (SELECT t.past FROM lane_past t WHERE t.parent_id = lane.parent_id)),
    ready_at = (SELECT min(c.available_at) FROM child c
                WHERE c.parent_id = lane.parent_id AND c.state = 'pending' AND c.available_at IS NOT NULL)
WHERE parent_id IN (SELECT parent_id FROM lane_past) AND (floor IS NOT NULL OR ready_at IS NOT NULL);
UPDATE child SET state = 'pending', attempts = max(attempts - 1, 0), claim_id = previous_claim_id,
    previous_claim_id = NULL, claimed_by = NULL, lease_expires_at = NULL
WHERE state = 'in_flight';
DROP TABLE lane_past;

DROP INDEX child_pending;

-- Children as the service shows them, for operators who inspect with SQL
-- (see the Postgres migration 0014).
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
    AND coalesce(c.sequence < ln.floor, 1) AND h.parent_id = c.parent_id
    AND h.lo <= c.sequence AND h.hi >= c.sequence
    AND EXISTS (SELECT 1 FROM json_each(h.sequences) WHERE value = c.sequence);
