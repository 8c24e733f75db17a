-- A claim stamps its flow key served with a stamp later than every other
-- key's of its queue. It read the queue's highest `served` first: by the
-- index on `(queue, served)` until migration 0025 dropped it (so that the
-- stamp's write is a HOT update), then by the primary key, which walked
-- every key row of the queue on every claim of a keyed queue. The stamp is
-- now drawn from this sequence: one step per claim however many keys a
-- queue has, the write still HOT. It starts past every stamp already given,
-- so keys served before this migration keep their order.
CREATE SEQUENCE flow_limit_served;
SELECT setval('flow_limit_served', (SELECT coalesce(max(served), 0) + 1 FROM flow_limit), false);
