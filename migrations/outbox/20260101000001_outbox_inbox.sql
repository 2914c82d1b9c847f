-- Tables of the shared outbox library (libs/outbox). Every service database has
-- them; the versions are chosen so they never collide with a service's own.

-- Domain events written in the same transaction as the business change.
CREATE TABLE outbox (
    seq            BIGSERIAL PRIMARY KEY,
    id             UUID        NOT NULL UNIQUE,       -- CloudEvents id
    aggregate_type TEXT        NOT NULL,              -- topic suffix: <prefix>.<aggregate_type>
    aggregate_id   TEXT        NOT NULL,              -- Kafka key: keeps an aggregate's events in one partition
    event_type     TEXT        NOT NULL,              -- CloudEvents type, e.g. OrderConfirmed
    schema_version INT         NOT NULL,
    source         TEXT        NOT NULL,              -- CloudEvents source, e.g. /sagaworks/order
    content_type   TEXT        NOT NULL,
    payload        BYTEA       NOT NULL,
    traceparent    TEXT,                              -- W3C trace context of the writing span
    tracestate     TEXT,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at   TIMESTAMPTZ
);

-- The relay's two questions: what is unpublished, and what is each aggregate's head.
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_unpublished_by_aggregate ON outbox (aggregate_id, seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;

-- Events a consumer group has handled; makes redelivery a no-op.
CREATE TABLE inbox (
    consumer_group TEXT        NOT NULL,
    event_id       UUID        NOT NULL,
    event_type     TEXT        NOT NULL,
    topic          TEXT        NOT NULL,
    kafka_partition INT        NOT NULL,
    kafka_offset   BIGINT      NOT NULL,
    processed_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, event_id)
);
