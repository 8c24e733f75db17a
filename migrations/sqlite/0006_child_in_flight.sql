-- A parent's in-flight count read this parent's in-flight children, not every
-- in-flight child of the ledger (the plan went through `child_leased`, whose
-- dead entries, with autovacuum off, grow with every claim ever made).
CREATE INDEX child_in_flight ON child (parent_id) WHERE state = 'in_flight';
