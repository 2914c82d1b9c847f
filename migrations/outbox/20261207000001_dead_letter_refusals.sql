-- Replays refused because a dead letter is not what its topic's publisher wrote
-- (sagaworks_outbox::dead_letters): its original record is gone from the topic,
-- or its key, payload or CloudEvents headers differ from it. One row per message
-- per refused request; the message stays pending (an operator discards it).
CREATE TABLE dead_letter_refusals (
    dlq_topic       TEXT NOT NULL,
    dlq_partition   INT NOT NULL,
    dlq_offset      BIGINT NOT NULL,
    idempotency_key TEXT NOT NULL,
    actor           TEXT NOT NULL,
    reason          TEXT NOT NULL,
    why             TEXT NOT NULL,
    at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset, idempotency_key)
);
