-- {{Name}}'s own database. The outbox and inbox tables come from libs/outbox
-- (sagaworks_outbox::migrator(), run next to these migrations).

CREATE TABLE items (
    id         UUID PRIMARY KEY,
    product_id UUID NOT NULL,
    name       TEXT NOT NULL,
    -- PENDING while the item's claim saga (src/saga.rs) runs, then ACTIVE or REJECTED.
    status     TEXT NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'ACTIVE', 'REJECTED')),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- When an item's claim ended ACTIVE: written by version 2 of the claim saga
-- (`stamp_activation`). A row of its own, not a column of `items`: the saga's end updates
-- the item in the same statement, and PostgreSQL applies only one of two updates of one
-- row in one statement.
CREATE TABLE item_activations (
    item_id      UUID PRIMARY KEY REFERENCES items (id),
    activated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A read model fed by the consumer (src/events.rs): orders confirmed elsewhere.
CREATE TABLE confirmed_orders (
    order_id     UUID PRIMARY KEY,
    total_cents  BIGINT NOT NULL,
    confirmed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

