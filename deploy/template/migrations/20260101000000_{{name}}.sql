-- {{Name}}'s own database. The outbox and inbox tables come from libs/outbox
-- (sagaworks_outbox::migrator(), run next to these migrations).

CREATE TABLE items (
    id         UUID PRIMARY KEY,
    product_id UUID NOT NULL,
    name       TEXT NOT NULL,
    -- PENDING while the item's claim saga (src/saga.rs) runs, then ACTIVE or REJECTED.
    status     TEXT NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'ACTIVE', 'REJECTED')),
    -- When its claim saga ended ACTIVE (version 2 of the saga; NULL for version 1's claims).
    activated_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A read model fed by the consumer (src/events.rs): orders confirmed elsewhere.
CREATE TABLE confirmed_orders (
    order_id     UUID PRIMARY KEY,
    total_cents  BIGINT NOT NULL,
    confirmed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

