-- A parent's verdict (issue 30): how many failed children it tolerates (a
-- count or a percentage of its total; NULL both: none), and whether a cancel
-- completed it. The verdict itself is derived from these and the counters,
-- which reconcile proves, so it cannot drift apart from them.
ALTER TABLE parent ADD COLUMN tolerated_count bigint CHECK (tolerated_count >= 0),
    ADD COLUMN tolerated_percent double precision CHECK (tolerated_percent BETWEEN 0 AND 100),
    ADD COLUMN cancelled_at timestamptz;

-- Redrive: a parent registered from another's selected children names it,
-- and each of its children names the child it was made from.
ALTER TABLE parent ADD COLUMN redrive_of text;
ALTER TABLE child ADD COLUMN redrive_of_parent text, ADD COLUMN redrive_of_sequence bigint;
