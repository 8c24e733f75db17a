-- Leases in a table of their own: one row per claim and parent, naming the
-- children it leased, written by the statement that claims them. The three
-- indexes of in-flight children (by lease expiry, by claim id, by parent)
-- gave every claimed child three index entries; the lease expiry sweep, the
-- lease operations (extend, release) and the claim's queue check now find a
-- claim's children through its lease rows and the primary key instead.
-- `sequences` may name children that have since been released or recorded:
-- every statement that follows a lease also checks the child's `claim_id`
-- and state. A lease row goes once its expiry has been swept.
CREATE TABLE claim_lease (
    claim_id   uuid NOT NULL,
    parent_id  text NOT NULL,
    sequences  bigint[] NOT NULL,
    expires_at timestamptz NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (claim_id, parent_id)
);
CREATE INDEX claim_lease_expiry ON claim_lease (expires_at);
-- In-flight children newest claim first (the children search).
CREATE INDEX claim_lease_claimed ON claim_lease (claimed_at);

INSERT INTO claim_lease (claim_id, parent_id, sequences, expires_at, claimed_at)
SELECT claim_id, parent_id, array_agg(sequence ORDER BY sequence), max(lease_expires_at), max(changed_at)
FROM child WHERE state = 'in_flight' AND claim_id IS NOT NULL
GROUP BY claim_id, parent_id;

DROP INDEX child_leased;
DROP INDEX child_claim;
DROP INDEX child_in_flight;

-- Room on each page for a child's next versions (its claim, its outcome):
-- an update that stays on its page logs only what changed, and needs no
-- second WAL record to lock the old version while the new one finds a page.
-- Applies to pages written from now on.
ALTER TABLE child SET (fillfactor = 60);

-- Terminal and held children newest change first, per state: the children
-- search (`GET /v1/children?state=...`); in-flight children are found through
-- their leases, pending ones through `child_pending_changed`.
DROP INDEX child_attention;
CREATE INDEX child_attention ON child (state, changed_at, parent_id, sequence)
    WHERE state IN ('processed', 'failed', 'skipped', 'held');

-- Pending children newest change first, across parents: the children search
-- of pending children, and each queue's oldest pending child. It replaces the
-- per-parent index of the same rows (an entry per pending child either way).
DROP INDEX child_pending_since;
CREATE INDEX child_pending_changed ON child (changed_at, parent_id, sequence) WHERE state = 'pending';
