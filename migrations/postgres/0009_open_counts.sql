-- Reads whose cost does not grow with the ledger (dashboards poll them). A parent's pending,
-- in-flight and held counts were three count(*) over its children on every
-- read; now the statements that move children keep them, each on the row it
-- already writes, so claims and outcomes never wait on each other's row:
--
--   lane.claimed       children leased (pending -> in_flight): claims
--   lane.unclaimed     leases that ended without an outcome: release, expiry
--   lane.held_in       expired leases kept held
--   lane.held_out      held children retried (held -> pending)
--   parent.settled_in_flight, parent.settled_held
--                      outcomes recorded for in-flight / held children
--
--   in_flight = claimed - unclaimed - settled_in_flight
--   held      = held_in - held_out - settled_held
--   pending   = total - processed - failed - skipped - in_flight - held
--
-- Reconcile compares them with the rows and repairs them, like the stored
-- counters. child.settled_from is the state a child left for its outcome
-- (what the outcome statement counts); child.changed_at is when a child last
-- changed state: for a pending child, since when it waits (children of
-- ledgers older than this migration count from the migration).
ALTER TABLE lane
    ADD COLUMN claimed bigint NOT NULL DEFAULT 0,
    ADD COLUMN unclaimed bigint NOT NULL DEFAULT 0,
    ADD COLUMN held_in bigint NOT NULL DEFAULT 0,
    ADD COLUMN held_out bigint NOT NULL DEFAULT 0;

ALTER TABLE parent
    ADD COLUMN settled_in_flight bigint NOT NULL DEFAULT 0,
    ADD COLUMN settled_held bigint NOT NULL DEFAULT 0;

-- Throughput from the database, so every replica reports the same: the
-- outcomes of the current minute (`minute`, minutes since the epoch) and of
-- the one before, kept by the statement that counts outcomes anyway.
ALTER TABLE parent
    ADD COLUMN minute bigint NOT NULL DEFAULT 0,
    ADD COLUMN minute_processed bigint NOT NULL DEFAULT 0,
    ADD COLUMN minute_failed bigint NOT NULL DEFAULT 0,
    ADD COLUMN previous_minute_processed bigint NOT NULL DEFAULT 0,
    ADD COLUMN previous_minute_failed bigint NOT NULL DEFAULT 0;

ALTER TABLE child
    ADD COLUMN settled_from text,
    ADD COLUMN changed_at timestamptz NOT NULL DEFAULT now();

UPDATE lane l SET
    claimed = (SELECT count(*) FROM child c WHERE c.parent_id = l.parent_id AND c.state = 'in_flight'),
    held_in = (SELECT count(*) FROM child c WHERE c.parent_id = l.parent_id AND c.state = 'held');

-- a queue's oldest pending child: per parent, the first entry
CREATE INDEX child_pending_since ON child (parent_id, changed_at) WHERE state = 'pending';
-- children search across parents (GET /v1/children), newest change first,
-- for the states a dashboard looks for
CREATE INDEX child_attention ON child (state, changed_at) WHERE state IN ('failed', 'held');
