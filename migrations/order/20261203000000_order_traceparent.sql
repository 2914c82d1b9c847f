-- The W3C traceparent of the CreateOrder call: a saga resumed later (by any
-- replica) continues the order's trace from it.
ALTER TABLE orders ADD COLUMN traceparent TEXT;
