-- Operators' actions on dead-lettered messages (sagaworks_outbox::dead_letters).
-- A request is one operator call (replay one message, one key's or all
-- pending ones, or discard one), answered again for a repeated
-- Idempotency-Key; each message it took is a row of dead_letter_actions, so
-- a message is replayed or discarded at most once.
CREATE TABLE dead_letter_requests (
    dlq_topic       TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    action          TEXT NOT NULL CHECK (action IN ('replay', 'discard')),
    -- What was asked for: {"id": "0-3"}, {"key": "..."} or {"all": true}.
    selector        JSONB NOT NULL,
    actor           TEXT NOT NULL,
    reason          TEXT NOT NULL,
    at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (dlq_topic, idempotency_key)
);

CREATE TABLE dead_letter_actions (
    dlq_topic       TEXT NOT NULL,
    dlq_partition   INT NOT NULL,
    dlq_offset      BIGINT NOT NULL,
    idempotency_key TEXT NOT NULL,
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset),
    FOREIGN KEY (dlq_topic, idempotency_key) REFERENCES dead_letter_requests (dlq_topic, idempotency_key)
);
CREATE INDEX dead_letter_actions_request ON dead_letter_actions (dlq_topic, idempotency_key);
