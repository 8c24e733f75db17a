-- A parent's failed and skipped children counted by state and reason, for
-- its summary (the 20 most frequent reasons) without reading its rows: kept
-- in the transaction that writes the children, by triggers that fire only
-- for a row that becomes, or stops being, failed or skipped (an outcome of
-- processed adds nothing). Reconcile compares these counts with the rows and
-- rewrites them when they disagree. `reason_null` tells a missing reason
-- from an empty one.
CREATE TABLE child_reason (
    parent_id   TEXT NOT NULL REFERENCES parent (parent_id) ON DELETE CASCADE,
    state       TEXT NOT NULL CHECK (state IN ('failed', 'skipped')),
    reason_null INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    n           INTEGER NOT NULL,
    PRIMARY KEY (parent_id, state, reason_null, reason)
) WITHOUT ROWID;

CREATE TRIGGER child_reason_inserted AFTER INSERT ON child
WHEN new.state IN ('failed', 'skipped')
BEGIN
    INSERT INTO child_reason (parent_id, state, reason_null, reason, n)
    VALUES (new.parent_id, new.state, new.reason IS NULL, coalesce(new.reason, ''), 1)
    ON CONFLICT DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER child_reason_updated AFTER UPDATE OF state, reason ON child
WHEN (new.state IN ('failed', 'skipped') OR old.state IN ('failed', 'skipped'))
    AND (new.state IS NOT old.state OR new.reason IS NOT old.reason)
BEGIN
    UPDATE child_reason SET n = n - 1
    WHERE old.state IN ('failed', 'skipped') AND parent_id = old.parent_id AND state = old.state
        AND reason_null = (old.reason IS NULL) AND reason = coalesce(old.reason, '');
    INSERT INTO child_reason (parent_id, state, reason_null, reason, n)
    SELECT new.parent_id, new.state, new.reason IS NULL, coalesce(new.reason, ''), 1
    WHERE new.state IN ('failed', 'skipped')
    ON CONFLICT DO UPDATE SET n = n + 1;
END;

-- The children already written.
INSERT INTO child_reason (parent_id, state, reason_null, reason, n)
SELECT parent_id, state, reason IS NULL, coalesce(reason, ''), count(*)
FROM child WHERE state IN ('failed', 'skipped')
GROUP BY parent_id, state, reason IS NULL, coalesce(reason, '');
