-- The ledger: one row per parent, one row per child. Column names of the
-- stored projection (parent.total/processed/failed/skipped/completed_at) are
-- part of the operator contract.

CREATE TABLE parent (
    parent_id      text PRIMARY KEY,
    -- insertion order: the list cursor ("oldest first")
    position       bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    queue          text NOT NULL,
    payload        jsonb,
    max_attempts   integer CHECK (max_attempts IS NULL OR max_attempts > 0),
    expired_lease  text NOT NULL DEFAULT 'retry' CHECK (expired_lease IN ('retry', 'hold')),
    fingerprint    text NOT NULL,
    total          bigint NOT NULL DEFAULT 0,
    processed      bigint NOT NULL DEFAULT 0,
    failed         bigint NOT NULL DEFAULT 0,
    skipped        bigint NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    decomposed_at  timestamptz,
    completed_at   timestamptz
);

-- queue claims walk the open parents of one queue, oldest first
CREATE INDEX parent_open_by_queue ON parent (queue, position)
    WHERE decomposed_at IS NOT NULL AND completed_at IS NULL;

CREATE TABLE child (
    parent_id        text NOT NULL REFERENCES parent (parent_id),
    sequence         bigint NOT NULL CHECK (sequence >= 0),
    key              text,
    payload          jsonb NOT NULL,
    state            text NOT NULL
        CHECK (state IN ('pending', 'in_flight', 'held', 'processed', 'failed', 'skipped')),
    attempts         integer NOT NULL DEFAULT 0,
    available_at     timestamptz,
    claim_id         uuid,
    claimed_by       text,
    lease_expires_at timestamptz,
    previous_attempt text CHECK (previous_attempt IN ('released', 'expired')),
    outcome_attempt  integer,
    reason           text,
    result           jsonb,
    terminal_at      timestamptz,
    conflicts        jsonb,
    PRIMARY KEY (parent_id, sequence)
);

CREATE UNIQUE INDEX child_key ON child (parent_id, key) WHERE key IS NOT NULL;
-- claims: lowest pending sequence of a parent first; only pending rows are indexed,
-- so a claim never wades through leased or terminal entries
CREATE INDEX child_pending ON child (parent_id, sequence) WHERE state = 'pending';
-- the lease sweep, and extend/release by claim
CREATE INDEX child_leased ON child (lease_expires_at) WHERE state = 'in_flight';
CREATE INDEX child_claim ON child (claim_id) WHERE state = 'in_flight';
CREATE INDEX child_held ON child (parent_id) WHERE state = 'held';
