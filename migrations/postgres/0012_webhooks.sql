-- Completion webhooks through an outbox.
--
-- `webhook_event` is written by the statement that completes a parent (the
-- outcome and lease-expiry statements' `bumped` CTE, registration, seal,
-- cancel and reconcile), so an event exists exactly when its completion
-- committed. One event per completion: a parent completes at one
-- `completed_at`, and reconcile can clear it and a later statement set it
-- again (a second completion, a second event). The sender claims due events
-- `FOR UPDATE SKIP LOCKED` and leases them while it delivers, so no two
-- replicas deliver one attempt and a killed replica's lease runs out.
ALTER TABLE parent ADD COLUMN webhook_url text;

CREATE TABLE webhook_event (
    event_id         uuid PRIMARY KEY,
    parent_id        text NOT NULL REFERENCES parent (parent_id) ON DELETE CASCADE,
    completed_at     timestamptz NOT NULL,
    url              text NOT NULL,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    -- attempts made, numbering them; failures since it was last queued
    attempts         integer NOT NULL DEFAULT 0,
    failures         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    -- the body, fixed by the first attempt so every attempt sends the same bytes
    body             text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    UNIQUE (parent_id, completed_at)
);

-- the sender's due events
CREATE INDEX webhook_event_due ON webhook_event (next_attempt_at) WHERE state = 'pending';

CREATE TABLE webhook_attempt (
    event_id        uuid NOT NULL REFERENCES webhook_event (event_id) ON DELETE CASCADE,
    attempt         integer NOT NULL,
    attempted_at    timestamptz NOT NULL,
    status_code     integer,
    error           text,
    next_attempt_at timestamptz,
    -- the replica that made it
    sender          text NOT NULL,
    PRIMARY KEY (event_id, attempt)
);
