-- The columns an outcome batch carries when its children's rows were not
-- rewritten (see the Postgres migration of the same name). SQLite rewrites
-- every row it records, so its batches leave them NULL, and the readers the
-- two stores share find none of their children.
ALTER TABLE processed_batch ADD COLUMN claim_id TEXT;
ALTER TABLE processed_batch ADD COLUMN worker TEXT;
ALTER TABLE processed_batch ADD COLUMN expires_at TEXT;
