-- The claim that held a child before its current claim. A late outcome from
-- that holder (its lease expired, or it released the child) is then credited
-- to its own attempt, `attempts - 1`, rather than to no attempt at all.
ALTER TABLE child ADD COLUMN previous_claim_id TEXT;
