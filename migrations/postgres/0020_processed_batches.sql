-- Processed children leave the children search's per-child indexes (issue
-- 28): an outcome of `processed` is most of every ledger's writes, and its
-- two entries there (`child_attention` across parents, `child_settled_by_parent`
-- of one) were two of the three index entries each outcome wrote, about a
-- fifth of the Postgres work of a child's claim and outcome. The search now
-- finds processed children through the outcome statements that made them:
-- one row per statement and parent, naming the children it made processed
-- (`lo` to `hi`, or the list `sequences` when they are not every sequence
-- between), at the statement's `changed_at`, which its children carry. A
-- processed child stays processed (terminal is one-way), so every child a
-- row names is processed at that time; the rows go with their parent.
CREATE TABLE processed_batch (
    parent_id  text NOT NULL REFERENCES parent (parent_id) ON DELETE CASCADE,
    changed_at timestamptz NOT NULL,
    lo         bigint NOT NULL,
    hi         bigint NOT NULL,
    sequences  bigint[]
);
-- Newest first, across parents and of one.
CREATE INDEX processed_batch_changed ON processed_batch (changed_at, parent_id);
CREATE INDEX processed_batch_parent ON processed_batch (parent_id, changed_at);

-- The processed children so far, a row per parent, change and thousand
-- sequences.
INSERT INTO processed_batch (parent_id, changed_at, lo, hi, sequences)
SELECT parent_id, changed_at, min(sequence), max(sequence), array_agg(sequence ORDER BY sequence)
FROM child WHERE state = 'processed'
GROUP BY parent_id, changed_at, sequence / 1000;

DROP INDEX child_attention;
CREATE INDEX child_attention ON child (state, changed_at, parent_id, sequence)
    WHERE state IN ('failed', 'skipped', 'held');
DROP INDEX child_settled_by_parent;
CREATE INDEX child_settled_by_parent ON child (parent_id, state, changed_at, sequence)
    WHERE state IN ('failed', 'skipped', 'held');
