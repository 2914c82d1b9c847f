-- Inventory's own database: the product catalogue, prices and stock.
-- Invariant per product: available + reserved + sold = every unit ever stocked.

CREATE TABLE products (
    id          UUID PRIMARY KEY,
    sku         TEXT   NOT NULL UNIQUE,
    name        TEXT   NOT NULL,
    price_cents BIGINT NOT NULL CHECK (price_cents >= 0),
    available   BIGINT NOT NULL CHECK (available >= 0),
    reserved    BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    sold        BIGINT NOT NULL DEFAULT 0 CHECK (sold >= 0),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One per saga (id = saga id). RELEASED without lines is a tombstone: the
-- release came first, so a late reserve with this id is refused.
CREATE TABLE reservations (
    id          UUID PRIMARY KEY,
    order_id    UUID   NOT NULL,
    status      TEXT   NOT NULL CHECK (status IN ('RESERVED', 'RELEASED', 'COMMITTED')),
    total_cents BIGINT NOT NULL DEFAULT 0,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX reservations_order ON reservations (order_id);

CREATE TABLE reservation_lines (
    reservation_id   UUID   NOT NULL REFERENCES reservations (id),
    product_id       UUID   NOT NULL REFERENCES products (id),
    quantity         BIGINT NOT NULL CHECK (quantity > 0),
    unit_price_cents BIGINT NOT NULL,
    PRIMARY KEY (reservation_id, product_id)
);

-- Outcomes of mutating calls by idempotency key (sagaworks_runtime::idempotency).
CREATE TABLE idempotency_keys (
    key          TEXT PRIMARY KEY,
    request_hash BYTEA NOT NULL,
    status_code  INT,
    message      TEXT,
    response     BYTEA,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
