-- Live views and traces (issue 31).
--
-- A queue's event stream reads its parents' completions in the order they
-- were stamped, from where it last looked.
CREATE INDEX parent_queue_completed ON parent (queue, completed_at) WHERE completed_at IS NOT NULL;

-- The W3C trace context a registration carried: the parent's own (sequence
-- -1, from the request's traceparent header) and each child's that was given
-- one. Written once, with the registration or append; deleted with the parent.
CREATE TABLE trace_context (
    parent_id   text NOT NULL,
    sequence    bigint NOT NULL,
    traceparent text NOT NULL,
    PRIMARY KEY (parent_id, sequence)
);
