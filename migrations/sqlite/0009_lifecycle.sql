-- Lifecycle: paused queues, and the pruner's way to complete parents (see
-- the Postgres migration of the same name).
CREATE TABLE queue_pause (
    queue     TEXT PRIMARY KEY,
    paused_at TEXT NOT NULL
);

CREATE INDEX parent_completed ON parent (completed_at) WHERE completed_at IS NOT NULL;
