-- The ledger: one row per parent, one row per child. Column names of the
-- stored projection (parent.total/processed/failed/skipped/completed_at) are
-- part of the operator contract. Times are RFC 3339 UTC text with
-- milliseconds ('%Y-%m-%dT%H:%M:%fZ'), so they compare as strings.

CREATE TABLE parent (
    -- insertion order: the list cursor ("oldest first")
    position       INTEGER PRIMARY KEY AUTOINCREMENT,
    parent_id      TEXT NOT NULL UNIQUE,
    queue          TEXT NOT NULL,
    payload        TEXT,
    max_attempts   INTEGER CHECK (max_attempts IS NULL OR max_attempts > 0),
    expired_lease  TEXT NOT NULL DEFAULT 'retry' CHECK (expired_lease IN ('retry', 'hold')),
    fingerprint    TEXT NOT NULL,
    total          INTEGER NOT NULL DEFAULT 0,
    processed      INTEGER NOT NULL DEFAULT 0,
    failed         INTEGER NOT NULL DEFAULT 0,
    skipped        INTEGER NOT NULL DEFAULT 0,
    created_at     TEXT NOT NULL,
    decomposed_at  TEXT,
    completed_at   TEXT
);

CREATE INDEX parent_open_by_queue ON parent (queue, position)
    WHERE decomposed_at IS NOT NULL AND completed_at IS NULL;

CREATE TABLE child (
    parent_id        TEXT NOT NULL REFERENCES parent (parent_id),
    sequence         INTEGER NOT NULL CHECK (sequence >= 0),
    key              TEXT,
    payload          TEXT NOT NULL,
    state            TEXT NOT NULL
        CHECK (state IN ('pending', 'in_flight', 'held', 'processed', 'failed', 'skipped')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    available_at     TEXT,
    claim_id         TEXT,
    claimed_by       TEXT,
    lease_expires_at TEXT,
    previous_attempt TEXT CHECK (previous_attempt IN ('released', 'expired')),
    outcome_attempt  INTEGER,
    reason           TEXT,
    result           TEXT,
    terminal_at      TEXT,
    conflicts        TEXT,
    PRIMARY KEY (parent_id, sequence)
) WITHOUT ROWID;

CREATE UNIQUE INDEX child_key ON child (parent_id, key) WHERE key IS NOT NULL;
CREATE INDEX child_pending ON child (parent_id, sequence) WHERE state = 'pending';
CREATE INDEX child_leased ON child (lease_expires_at) WHERE state = 'in_flight';
CREATE INDEX child_claim ON child (claim_id) WHERE state = 'in_flight';
CREATE INDEX child_held ON child (parent_id) WHERE state = 'held';
