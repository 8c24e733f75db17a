-- Claim admission (see migrations/postgres/0017_admission.sql). SQLite's
-- writes take turns, so a claim in a limited queue counts what is in flight
-- inside its write transaction without a row lock.
ALTER TABLE parent ADD COLUMN not_before TEXT;
ALTER TABLE parent ADD COLUMN flow_key TEXT;
ALTER TABLE parent ADD COLUMN backoff_initial REAL;
ALTER TABLE parent ADD COLUMN backoff_max REAL;
ALTER TABLE child ADD COLUMN not_before TEXT;
ALTER TABLE lane ADD COLUMN not_before TEXT;
ALTER TABLE lane ADD COLUMN flow_key TEXT;
ALTER TABLE claim_lease ADD COLUMN queue TEXT;
ALTER TABLE claim_lease ADD COLUMN flow_key TEXT;
CREATE INDEX claim_lease_flow ON claim_lease (queue, flow_key, expires_at);

CREATE TABLE flow_limit (
    queue             TEXT NOT NULL,
    flow_key          TEXT NOT NULL,
    limited           INTEGER NOT NULL DEFAULT 0,
    max_in_flight     INTEGER,
    per_second        REAL,
    burst             REAL,
    key_max_in_flight INTEGER,
    key_per_second    REAL,
    key_burst         REAL,
    overridden        INTEGER NOT NULL DEFAULT 0,
    tokens            REAL,
    refilled_at       TEXT,
    served            INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, flow_key)
) WITHOUT ROWID;
CREATE INDEX flow_limit_served ON flow_limit (queue, served);

CREATE TABLE queue_setting (
    queue       TEXT PRIMARY KEY,
    claim_order TEXT NOT NULL DEFAULT 'fair' CHECK (claim_order IN ('fair', 'oldest'))
);
CREATE INDEX lane_oldest ON lane (queue, priority DESC, position)
    WHERE floor IS NOT NULL OR ready_at IS NOT NULL;
