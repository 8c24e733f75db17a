-- Live views and traces (see the Postgres migration 0016).
CREATE INDEX parent_queue_completed ON parent (queue, completed_at) WHERE completed_at IS NOT NULL;

CREATE TABLE trace_context (
    parent_id   TEXT NOT NULL,
    sequence    INTEGER NOT NULL,
    traceparent TEXT NOT NULL,
    PRIMARY KEY (parent_id, sequence)
);
