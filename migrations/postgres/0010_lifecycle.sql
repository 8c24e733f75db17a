-- Lifecycle: paused queues, and the pruner's way to complete parents.
--
-- A paused queue hands out no children: the claim statements look here
-- (a primary-key probe of a table of a few rows), so every replica honours a
-- pause the moment it commits.
CREATE TABLE queue_pause (
    queue     text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- the retention pruner: complete parents, oldest completion first
CREATE INDEX parent_completed ON parent (completed_at) WHERE completed_at IS NOT NULL;
