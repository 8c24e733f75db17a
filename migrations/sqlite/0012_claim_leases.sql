-- Leases in a table of their own (see the Postgres migration 0013): one row
-- per claim and parent, `sequences` a JSON array of the children it leased.
CREATE TABLE claim_lease (
    claim_id   TEXT NOT NULL,
    parent_id  TEXT NOT NULL,
    sequences  TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    claimed_at TEXT NOT NULL,
    PRIMARY KEY (claim_id, parent_id)
);
CREATE INDEX claim_lease_expiry ON claim_lease (expires_at);
CREATE INDEX claim_lease_claimed ON claim_lease (claimed_at);

INSERT INTO claim_lease (claim_id, parent_id, sequences, expires_at, claimed_at)
SELECT claim_id, parent_id, json_group_array(sequence), max(lease_expires_at), max(changed_at)
FROM (SELECT * FROM child WHERE state = 'in_flight' AND claim_id IS NOT NULL ORDER BY sequence)
GROUP BY claim_id, parent_id;

DROP INDEX child_leased;
DROP INDEX child_claim;
DROP INDEX child_in_flight;

DROP INDEX child_attention;
CREATE INDEX child_attention ON child (state, changed_at, parent_id, sequence)
    WHERE state IN ('processed', 'failed', 'skipped', 'held');

-- Pending children newest change first, across parents: the children search
-- of pending children, and each queue's oldest pending child. It replaces the
-- per-parent index of the same rows (an entry per pending child either way).
DROP INDEX child_pending_since;
CREATE INDEX child_pending_changed ON child (changed_at, parent_id, sequence) WHERE state = 'pending';
