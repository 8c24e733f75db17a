-- Claim admission: when, and how fast, children may be claimed.
--
-- A parent's `not_before` gates its lane (`lane.not_before`): nothing of it
-- is claimable before. A child's own `not_before` is kept on the child; a
-- parent with any such child hands out all its children through
-- `available_at` (the given-back path, earliest first) and opens its lane
-- without a floor, so a child claimed early in sequence order is never
-- read again from the floor.
--
-- `retry_backoff` (`backoff_initial`, `backoff_max` seconds) delays a child
-- given back after an expired lease or a release without a delay: full
-- jitter over `min(max, initial * 2^(attempt - 1))`.
--
-- `flow_key` names what a parent's children count against. `flow_limit`
-- holds, per queue, one row with `flow_key = ''` (the queue's own limits and
-- the default limits of each of its keys, `key_*`) and one row per key (its
-- token bucket, when it was last served, and, when `overridden`, limits that
-- replace the queue's `key_*`). A claim in a queue whose row says `limited`
-- locks that row before it counts what is in flight: claims of a limited
-- queue take turns on it, on every replica and through any pooler.
-- What is in flight is the sum of `claim_lease.open` over live leases, so an
-- outcome, a release or an expiry frees a slot by itself.
ALTER TABLE parent
    ADD COLUMN not_before timestamptz,
    ADD COLUMN flow_key text,
    ADD COLUMN backoff_initial double precision,
    ADD COLUMN backoff_max double precision;
ALTER TABLE child ADD COLUMN not_before timestamptz;
ALTER TABLE lane
    ADD COLUMN not_before timestamptz,
    ADD COLUMN flow_key text;
ALTER TABLE claim_lease
    ADD COLUMN queue text,
    ADD COLUMN flow_key text;
CREATE INDEX claim_lease_flow ON claim_lease (queue, flow_key, expires_at);

CREATE TABLE flow_limit (
    queue             text NOT NULL,
    flow_key          text NOT NULL,
    limited           boolean NOT NULL DEFAULT false,
    max_in_flight     integer,
    per_second        double precision,
    burst             double precision,
    key_max_in_flight integer,
    key_per_second    double precision,
    key_burst         double precision,
    overridden        boolean NOT NULL DEFAULT false,
    tokens            double precision,
    refilled_at       timestamptz,
    served            bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, flow_key)
);
CREATE INDEX flow_limit_served ON flow_limit (queue, served);

-- A queue's order of parents: 'fair' (least recently served first) or
-- 'oldest' (oldest first).
CREATE TABLE queue_setting (
    queue       text PRIMARY KEY,
    claim_order text NOT NULL DEFAULT 'fair' CHECK (claim_order IN ('fair', 'oldest'))
);
CREATE INDEX lane_oldest ON lane (queue, priority DESC, position)
    WHERE floor IS NOT NULL OR ready_at IS NOT NULL;
