-- Background reconcile sweeps: one row per job, worked a page at a time by
-- the background loop, so a job outlives the process that started it.
CREATE TABLE reconcile_job (
    job_id           TEXT PRIMARY KEY,
    state            TEXT NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed')),
    dry_run          INTEGER NOT NULL,
    queue            TEXT,
    -- The creator's queue reach (`QueueScope::as_json`); NULL is every queue.
    scope            TEXT,
    -- The sweep has checked every parent up to this position.
    after_position   INTEGER NOT NULL DEFAULT 0,
    -- Drift is recorded up to this position (ahead of after_position mid-page),
    -- so a page worked again after a crash counts no parent twice.
    drift_position   INTEGER NOT NULL DEFAULT 0,
    checked          INTEGER NOT NULL DEFAULT 0,
    drifted          INTEGER NOT NULL DEFAULT 0,
    repaired         INTEGER NOT NULL DEFAULT 0,
    -- The first drifted parents' reports (bounded; `drifted` counts them all).
    parents          TEXT NOT NULL DEFAULT '[]',
    error            TEXT,
    -- Consecutive failed steps; the job fails when they reach the limit.
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at TEXT,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL
);

CREATE INDEX reconcile_job_running ON reconcile_job (created_at) WHERE state = 'running';
