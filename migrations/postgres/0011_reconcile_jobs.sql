-- Background reconcile sweeps: one row per job, worked a page at a time by
-- whichever replica holds its lease, so a job outlives the process that
-- started it.
CREATE TABLE reconcile_job (
    job_id           uuid PRIMARY KEY,
    state            text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed')),
    dry_run          boolean NOT NULL,
    queue            text,
    -- The creator's queue reach (`QueueScope::as_json`); NULL is every queue.
    scope            text,
    -- The sweep has checked every parent up to this position.
    after_position   bigint NOT NULL DEFAULT 0,
    -- Drift is recorded up to this position (ahead of after_position mid-page),
    -- so a page worked again after a crash counts no parent twice.
    drift_position   bigint NOT NULL DEFAULT 0,
    checked          bigint NOT NULL DEFAULT 0,
    drifted          bigint NOT NULL DEFAULT 0,
    repaired         bigint NOT NULL DEFAULT 0,
    -- The first drifted parents' reports (bounded; `drifted` counts them all).
    parents          jsonb NOT NULL DEFAULT '[]',
    error            text,
    -- Consecutive failed steps; the job fails when they reach the limit.
    attempts         integer NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX reconcile_job_running ON reconcile_job (created_at) WHERE state = 'running';
