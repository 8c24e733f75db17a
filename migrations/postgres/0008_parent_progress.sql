-- Dashboards: when a parent last made progress (an outcome recorded for one
-- of its children after registration), and the children with a conflict
-- log, so that `GET /v1/parents?has=conflicts` finds them without reading
-- every child (written only when a losing write is logged: rare).
ALTER TABLE parent ADD COLUMN last_progress_at timestamptz;

UPDATE parent p SET last_progress_at = (
    SELECT max(c.terminal_at) FROM child c
    WHERE c.parent_id = p.parent_id AND c.state IN ('processed', 'failed', 'skipped')
      AND c.terminal_at > p.created_at);

CREATE INDEX child_conflicted ON child (parent_id) WHERE conflict_count > 0;
