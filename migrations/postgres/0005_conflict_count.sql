-- A child's conflict log keeps its most recent 20 entries; `conflict_count`
-- counts every losing write, so a flood of them cannot grow the row.
ALTER TABLE child ADD COLUMN conflict_count bigint NOT NULL DEFAULT 0;

UPDATE child SET conflict_count = jsonb_array_length(conflicts) WHERE conflicts IS NOT NULL;
