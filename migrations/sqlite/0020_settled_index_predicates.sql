-- The two indexes of settled children name their states as an OR of
-- equalities rather than an `IN` list. Same rows, same order; but SQLite
-- evaluates a partial index's `IN` list of three again for every row an
-- UPDATE changes the indexed columns of, including every outcome that
-- leaves its child in neither index (a processed one): a quarter of the
-- outcome statement's time, measured with batches of 500. A statement
-- that names one state (`state = 'failed'`) implies the OR, so the
-- children search still reads them through these indexes.
DROP INDEX child_attention;
CREATE INDEX child_attention ON child (state, changed_at, parent_id, sequence)
    WHERE state = 'failed' OR state = 'skipped' OR state = 'held';
DROP INDEX child_settled_by_parent;
CREATE INDEX child_settled_by_parent ON child (parent_id, state, changed_at, sequence)
    WHERE state = 'failed' OR state = 'skipped' OR state = 'held';
