-- Fair queue claims: a parent's priority and its lane (see the Postgres
-- migration 0004_lanes.sql for what each column means). `lane_clock` hands
-- out the `served` stamps.
ALTER TABLE parent ADD COLUMN priority INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100);

CREATE TABLE lane_clock (id INTEGER PRIMARY KEY CHECK (id = 1), served INTEGER NOT NULL);
INSERT INTO lane_clock (id, served) VALUES (1, 0);

CREATE TABLE lane (
    parent_id TEXT PRIMARY KEY REFERENCES parent (parent_id),
    queue     TEXT NOT NULL,
    priority  INTEGER NOT NULL,
    position  INTEGER NOT NULL,
    served    INTEGER NOT NULL DEFAULT 0,
    floor     INTEGER,
    ready_at  TEXT
) WITHOUT ROWID;

CREATE INDEX lane_order ON lane (queue, priority DESC, served, position)
    WHERE floor IS NOT NULL OR ready_at IS NOT NULL;

CREATE INDEX child_delayed ON child (parent_id, available_at)
    WHERE state = 'pending' AND available_at IS NOT NULL;

INSERT INTO lane (parent_id, queue, priority, position, floor, ready_at)
SELECT p.parent_id, p.queue, p.priority, p.position,
    (SELECT min(c.sequence) FROM child c
     WHERE c.parent_id = p.parent_id AND c.state = 'pending' AND c.available_at IS NULL),
    (SELECT min(c.available_at) FROM child c
     WHERE c.parent_id = p.parent_id AND c.state = 'pending' AND c.available_at IS NOT NULL)
FROM parent p WHERE p.decomposed_at IS NOT NULL;
