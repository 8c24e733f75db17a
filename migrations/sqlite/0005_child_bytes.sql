-- The largest child payload of a parent, in bytes of JSON, so that a claim
-- can stay under `--max-response-bytes` by asking for fewer children instead
-- of leasing them and finding out. Set at registration and raised by
-- appends; copied to the lane when the parent is decomposed (appends end
-- there). NULL for parents registered before this column: they are counted
-- at `--max-payload-bytes`.
ALTER TABLE parent ADD COLUMN child_bytes INTEGER;
ALTER TABLE lane ADD COLUMN child_bytes INTEGER;
