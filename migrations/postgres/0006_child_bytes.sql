-- Payloads and results are kept as the JSON text the client sent (`json`),
-- not as `jsonb`: jsonb writes numbers out in full, so a 10-byte `1e131071`
-- came back as 131,072 digits, and what the service returns must be bounded
-- by what it accepted. Nothing reads inside them in SQL; comparisons cast.
ALTER TABLE child ALTER COLUMN payload TYPE json USING payload::json,
                  ALTER COLUMN result TYPE json USING result::json;
ALTER TABLE parent ALTER COLUMN payload TYPE json USING payload::json;

-- The largest child payload of a parent, in bytes of JSON, so that a claim
-- can stay under `--max-response-bytes` by asking for fewer children instead
-- of leasing them and finding out. Set at registration and raised by
-- appends; copied to the lane when the parent is decomposed (appends end
-- there). NULL for parents registered before this column: they are counted
-- at `--max-payload-bytes`.
ALTER TABLE parent ADD COLUMN child_bytes integer;
ALTER TABLE lane ADD COLUMN child_bytes integer;
