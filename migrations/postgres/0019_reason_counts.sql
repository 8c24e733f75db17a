-- A parent's failed and skipped children counted by state and reason, for
-- its summary (the 20 most frequent reasons) without reading its rows: kept
-- in the transaction that writes the children: by the registration's
-- insert itself for children skipped as invalid input (a row trigger would
-- upsert the same few rows once per child, each a new row version to walk
-- past), and by the statement trigger below for every update.
-- Reconcile compares these counts with the rows and rewrites them when they
-- disagree.
-- `reason_null` tells a missing reason from an empty one; the key holds the
-- reason's md5, since a reason (1,000 characters) may not fit a B-tree entry.
CREATE TABLE child_reason (
    parent_id   text NOT NULL REFERENCES parent (parent_id) ON DELETE CASCADE,
    state       text NOT NULL CHECK (state IN ('failed', 'skipped')),
    reason_null boolean NOT NULL,
    reason      text NOT NULL,
    n           bigint NOT NULL
);
CREATE UNIQUE INDEX child_reason_key ON child_reason (parent_id, state, reason_null, md5(reason));

-- An update (an outcome batch, an expiry, a cancel or a failed parent's
-- skips) counts as a set, once per statement: the reasons it made failed or
-- skipped, less those it changed from failed or skipped.
CREATE FUNCTION child_reason_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO child_reason AS r (parent_id, state, reason_null, reason, n)
    SELECT parent_id, state, reason IS NULL, coalesce(reason, ''), sum(d)
    FROM (SELECT parent_id, state, reason, 1 AS d FROM updated_new WHERE state IN ('failed', 'skipped')
          UNION ALL
          SELECT parent_id, state, reason, -1 FROM updated_old WHERE state IN ('failed', 'skipped')) t
    GROUP BY parent_id, state, reason IS NULL, coalesce(reason, '')
    HAVING sum(d) <> 0
    ORDER BY 1, 2, 3, 4
    ON CONFLICT (parent_id, state, reason_null, md5(reason)) DO UPDATE SET n = r.n + excluded.n;
    RETURN NULL;
END $$;

CREATE TRIGGER child_reason_updated AFTER UPDATE ON child
    REFERENCING OLD TABLE AS updated_old NEW TABLE AS updated_new
    FOR EACH STATEMENT EXECUTE FUNCTION child_reason_updated();

-- The children already written.
INSERT INTO child_reason (parent_id, state, reason_null, reason, n)
SELECT parent_id, state, reason IS NULL, coalesce(reason, ''), count(*)
FROM child WHERE state IN ('failed', 'skipped')
GROUP BY parent_id, state, reason IS NULL, coalesce(reason, '');
