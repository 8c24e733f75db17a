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
