-- Completion webhooks through an outbox (see the Postgres migration of the
-- same name).
ALTER TABLE parent ADD COLUMN webhook_url TEXT;

CREATE TABLE webhook_event (
    event_id         TEXT PRIMARY KEY,
    parent_id        TEXT NOT NULL REFERENCES parent (parent_id) ON DELETE CASCADE,
    completed_at     TEXT NOT NULL,
    url              TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    failures         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  TEXT NOT NULL,
    lease_expires_at TEXT,
    body             TEXT,
    created_at       TEXT NOT NULL,
    delivered_at     TEXT,
    UNIQUE (parent_id, completed_at)
);

CREATE INDEX webhook_event_due ON webhook_event (next_attempt_at) WHERE state = 'pending';

CREATE TABLE webhook_attempt (
    event_id        TEXT NOT NULL REFERENCES webhook_event (event_id) ON DELETE CASCADE,
    attempt         INTEGER NOT NULL,
    attempted_at    TEXT NOT NULL,
    status_code     INTEGER,
    error           TEXT,
    next_attempt_at TEXT,
    sender          TEXT NOT NULL,
    PRIMARY KEY (event_id, attempt)
);
