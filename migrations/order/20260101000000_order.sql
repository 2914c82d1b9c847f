-- Order's own database: orders, their saga state, and the per-order event timeline.

CREATE TABLE orders (
    id              UUID PRIMARY KEY,
    customer_id     UUID   NOT NULL,
    status          TEXT   NOT NULL CHECK (status IN ('PENDING', 'CONFIRMED', 'CANCELLED')),
    total_cents     BIGINT NOT NULL DEFAULT 0,
    failure_reason  TEXT,
    -- The client's Idempotency-Key and a hash of its request: a replay with the
    -- same key returns this order; the same key with another body is refused.
    idempotency_key TEXT   NOT NULL UNIQUE,
    request_hash    BYTEA  NOT NULL,
    trace_id        TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX orders_customer ON orders (customer_id, created_at DESC);

CREATE TABLE order_items (
    order_id         UUID   NOT NULL REFERENCES orders (id),
    product_id       UUID   NOT NULL,
    quantity         BIGINT NOT NULL CHECK (quantity > 0),
    unit_price_cents BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (order_id, product_id)
);

-- One saga per order. `current_step` is the next thing to do; a worker holds
-- the lease while it drives the saga, and any replica may take over a saga
-- whose lease has expired (its driver crashed).
CREATE TABLE sagas (
    id               UUID PRIMARY KEY,
    order_id         UUID NOT NULL UNIQUE REFERENCES orders (id),
    status           TEXT NOT NULL CHECK (status IN ('RUNNING', 'COMPENSATING', 'COMPLETED', 'COMPENSATED')),
    current_step     TEXT NOT NULL,
    failure_reason   TEXT,
    lease_owner      TEXT,
    lease_expires_at TIMESTAMPTZ,
    next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ
);
CREATE INDEX sagas_runnable ON sagas (next_attempt_at) WHERE status IN ('RUNNING', 'COMPENSATING');

CREATE TABLE saga_steps (
    saga_id     UUID NOT NULL REFERENCES sagas (id),
    name        TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED')),
    attempts    INT  NOT NULL DEFAULT 0,
    error       TEXT,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ,
    PRIMARY KEY (saga_id, name)
);

-- Events about an order seen on Kafka (from every service), for GET /v1/orders/{id}.
CREATE TABLE order_timeline (
    order_id    UUID NOT NULL,
    event_id    UUID NOT NULL,
    event_type  TEXT NOT NULL,
    source      TEXT NOT NULL,
    occurred_at TIMESTAMPTZ NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, event_id)
);
