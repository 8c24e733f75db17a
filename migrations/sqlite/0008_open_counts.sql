-- Reads whose cost does not grow with the ledger: see the Postgres migration
-- of the same name for the counts and how they are kept.
ALTER TABLE lane ADD COLUMN claimed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE lane ADD COLUMN unclaimed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE lane ADD COLUMN held_in INTEGER NOT NULL DEFAULT 0;
ALTER TABLE lane ADD COLUMN held_out INTEGER NOT NULL DEFAULT 0;

ALTER TABLE parent ADD COLUMN settled_in_flight INTEGER NOT NULL DEFAULT 0;
ALTER TABLE parent ADD COLUMN settled_held INTEGER NOT NULL DEFAULT 0;

ALTER TABLE parent ADD COLUMN minute INTEGER NOT NULL DEFAULT 0;
ALTER TABLE parent ADD COLUMN minute_processed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE parent ADD COLUMN minute_failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE parent ADD COLUMN previous_minute_processed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE parent ADD COLUMN previous_minute_failed INTEGER NOT NULL DEFAULT 0;

-- SQLite cannot add a column whose default is the clock: inserts set it.
ALTER TABLE child ADD COLUMN settled_from TEXT;
ALTER TABLE child ADD COLUMN changed_at TEXT;
UPDATE child SET changed_at = coalesce(terminal_at, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));

UPDATE lane SET
    claimed = (SELECT count(*) FROM child c WHERE c.parent_id = lane.parent_id AND c.state = 'in_flight'),
    held_in = (SELECT count(*) FROM child c WHERE c.parent_id = lane.parent_id AND c.state = 'held');

CREATE INDEX child_pending_since ON child (parent_id, changed_at) WHERE state = 'pending';
CREATE INDEX child_attention ON child (state, changed_at) WHERE state IN ('failed', 'held');
