-- A parent's reason counts (`child_reason`, migration 0019) are added by the
-- statements that make children failed or skipped: an outcome batch, an
-- expiry that exhausts a child's attempts and a parent's skips (each counts
-- its own `RETURNING` rows in a CTE, once per statement, as the trigger did;
-- the registration's insert already counted its own). No update takes a
-- child out of those states: an outcome is one-way.
-- The statement trigger this drops ran for every update of `child`, and
-- copied each updated row, old and new, into its transition tables: about a
-- sixth of an outcome batch of 500 processed children, none of them counted.
DROP TRIGGER child_reason_updated ON child;
DROP FUNCTION child_reason_updated();
