-- Idempotency keys are the client's: two customers may pick the same one.
-- A replay is the same customer with the same key.
ALTER TABLE orders DROP CONSTRAINT orders_idempotency_key_key;
ALTER TABLE orders ADD CONSTRAINT orders_customer_idempotency_key UNIQUE (customer_id, idempotency_key);
