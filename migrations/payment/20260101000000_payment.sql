-- Payment's own database: customer accounts and payments.
-- Invariant: a balance never goes below zero; per customer,
-- credits - balance = charged - refunded.

CREATE TABLE accounts (
    customer_id   UUID PRIMARY KEY,
    name          TEXT   NOT NULL,
    balance_cents BIGINT NOT NULL CHECK (balance_cents >= 0),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One per saga (id = saga id). VOIDED is a tombstone: the refund came first,
-- so a late charge with this id is refused.
CREATE TABLE payments (
    id           UUID PRIMARY KEY,
    customer_id  UUID   NOT NULL,
    order_id     UUID   NOT NULL,
    amount_cents BIGINT NOT NULL CHECK (amount_cents >= 0),
    status       TEXT   NOT NULL CHECK (status IN ('CHARGED', 'REFUNDED', 'VOIDED')),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX payments_customer ON payments (customer_id);

-- Outcomes of mutating calls by idempotency key (sagaworks_runtime::idempotency).
CREATE TABLE idempotency_keys (
    key          TEXT PRIMARY KEY,
    request_hash BYTEA NOT NULL,
    status_code  INT,
    message      TEXT,
    response     BYTEA,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
