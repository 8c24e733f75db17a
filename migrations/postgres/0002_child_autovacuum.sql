-- Claims and outcomes leave a dead row version per transition, and claims only
-- walk the pending index from its low end, so dead entries there slow every
-- claim of a big parent until they are vacuumed. Vacuum `child` after a fixed
-- number of changes instead of a fraction of a table that may hold millions of
-- terminal rows, and keep its statistics fresh for the planner.
ALTER TABLE child SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);
