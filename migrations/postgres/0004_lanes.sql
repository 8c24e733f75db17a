-- Fair queue claims. A parent's `priority` orders queue claims (higher
-- first). Each decomposed parent has a `lane`: a small row, apart from the
-- counters row that outcomes update, that says where its claimable children
-- are and when the queue last served it.
--
--   served    when a claim last took children of this parent (a value of
--             lane_served; 0 = never): queue claims start at the least
--             recently served lane, ties to the oldest (`position`)
--   floor     the lowest sequence of a pending child without a delay, or
--             NULL when it has none: no such child lies below it, so a claim
--             starts there and never wades through the index entries of
--             children already claimed or finished (dead until VACUUM)
--   ready_at  the earliest `available_at` of a pending child with a delay
--             (released with `delay_seconds`), NULL when it has none
--
-- Claims of one parent take turns on its lane row and move `floor` past what
-- they took; whatever makes a child pending again (release, an expired
-- lease, retry) lowers it in the same statement. A lane with neither a floor
-- nor a due `ready_at` has nothing to claim and is skipped at no cost.
ALTER TABLE parent ADD COLUMN priority integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100);

CREATE SEQUENCE lane_served;

CREATE TABLE lane (
    parent_id text PRIMARY KEY REFERENCES parent (parent_id),
    queue     text NOT NULL,
    priority  integer NOT NULL,
    position  bigint NOT NULL,
    served    bigint NOT NULL DEFAULT 0,
    floor     bigint,
    ready_at  timestamptz
);

-- queue claims: the claimable lanes of a queue in serving order
CREATE INDEX lane_order ON lane (queue, priority DESC, served, position)
    WHERE floor IS NOT NULL OR ready_at IS NOT NULL;

-- the delayed pending children of a parent, earliest first
CREATE INDEX child_delayed ON child (parent_id, available_at)
    WHERE state = 'pending' AND available_at IS NOT NULL;

INSERT INTO lane (parent_id, queue, priority, position, floor, ready_at)
SELECT p.parent_id, p.queue, p.priority, p.position,
    (SELECT min(c.sequence) FROM child c
     WHERE c.parent_id = p.parent_id AND c.state = 'pending' AND c.available_at IS NULL),
    (SELECT min(c.available_at) FROM child c
     WHERE c.parent_id = p.parent_id AND c.state = 'pending' AND c.available_at IS NOT NULL)
FROM parent p WHERE p.decomposed_at IS NOT NULL;
