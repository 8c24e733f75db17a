-- The children search (`GET /v1/children`, `store/search.rs`) reads each
-- state in its own order, newest change first, of all parents or of one.

-- A parent's terminal and held children (`child_attention` holds them
-- across parents).
CREATE INDEX child_settled_by_parent ON child (parent_id, state, changed_at, sequence)
    WHERE state IN ('processed', 'failed', 'skipped', 'held');

-- Given-back children (released, or their lease ran out), across parents and
-- of one: entries only for children that were given back.
CREATE INDEX child_given_back ON child (changed_at, parent_id, sequence)
    WHERE state = 'pending' AND available_at IS NOT NULL;
CREATE INDEX child_given_back_by_parent ON child (parent_id, changed_at, sequence)
    WHERE state = 'pending' AND available_at IS NOT NULL;

-- Leases newest claim first, across parents and of one (a row per claim and
-- parent, not per child).
DROP INDEX claim_lease_claimed;
CREATE INDEX claim_lease_claimed ON claim_lease (claimed_at, parent_id);
CREATE INDEX claim_lease_parent_claimed ON claim_lease (parent_id, claimed_at);

-- The parents of a queue, whatever their state: a filtered search reads a
-- queue with few parents parent by parent.
CREATE INDEX parent_queue ON parent (queue);

-- Whether a parent's children were written in sequence order (`changed_at`
-- never falls as the sequence rises): then its never-claimed children, newest
-- change first, are its rows from the top of its primary key down. A parent
-- registered whole is; one appended to keeps it while each append comes
-- after every sequence stored before it. Parents from before this are
-- counted in order when registered whole (decomposed when created).
ALTER TABLE parent ADD COLUMN children_in_order boolean NOT NULL DEFAULT true;
UPDATE parent SET children_in_order = false
WHERE decomposed_at IS NULL OR decomposed_at <> created_at;

-- A lane carries its parent's trace context (issue 31): the parent's own
-- `traceparent` and whether any child has one of its own, so a claim hands
-- them out from the row it locks anyway, and no replica keeps a copy that a
-- parent deleted and registered again elsewhere would leave stale.
ALTER TABLE lane ADD COLUMN traceparent text;
ALTER TABLE lane ADD COLUMN children_traced boolean NOT NULL DEFAULT false;
UPDATE lane SET
    traceparent = (SELECT t.traceparent FROM trace_context t WHERE t.parent_id = lane.parent_id AND t.sequence = -1),
    children_traced = EXISTS (SELECT 1 FROM trace_context t WHERE t.parent_id = lane.parent_id AND t.sequence >= 0);

-- A lease of every sequence from its `lo` to its `hi` keeps no list
-- (`sequences` is NULL): a claim of 500 from the floor up wrote a list of 4 KB
-- that was toasted and compressed, and read back by every outcome.
ALTER TABLE claim_lease ALTER COLUMN sequences DROP NOT NULL;
CREATE OR REPLACE VIEW child_status AS
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
    AND h.lo <= c.sequence AND h.hi >= c.sequence
    AND (h.sequences IS NULL OR c.sequence = ANY (h.sequences));
