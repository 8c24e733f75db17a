-- Processed children leave the children search's per-child indexes, found
-- instead through the outcome statements that made them: a row per
-- statement and parent (see the Postgres migration of the same name).
-- `sequences` is always the JSON list of the children it made processed.
CREATE TABLE processed_batch (
    parent_id  TEXT NOT NULL REFERENCES parent (parent_id) ON DELETE CASCADE,
    changed_at TEXT NOT NULL,
    lo         INTEGER NOT NULL,
    hi         INTEGER NOT NULL,
    sequences  TEXT NOT NULL
);
CREATE INDEX processed_batch_changed ON processed_batch (changed_at, parent_id);
CREATE INDEX processed_batch_parent ON processed_batch (parent_id, changed_at);

INSERT INTO processed_batch (parent_id, changed_at, lo, hi, sequences)
SELECT parent_id, changed_at, min(sequence), max(sequence), json_group_array(sequence)
FROM (SELECT parent_id, changed_at, sequence FROM child WHERE state = 'processed'
      ORDER BY parent_id, changed_at, sequence)
GROUP BY parent_id, changed_at, sequence / 1000;

DROP INDEX child_attention;
CREATE INDEX child_attention ON child (state, changed_at, parent_id, sequence)
    WHERE state IN ('failed', 'skipped', 'held');
DROP INDEX child_settled_by_parent;
CREATE INDEX child_settled_by_parent ON child (parent_id, state, changed_at, sequence)
    WHERE state IN ('failed', 'skipped', 'held');
