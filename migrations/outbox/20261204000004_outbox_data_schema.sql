-- CloudEvents `dataschema` of each event: the URI naming its payload's schema
-- (set for typed events; see libs/outbox/src/event.rs). Nullable, so adding
-- it rewrites nothing.
ALTER TABLE outbox ADD COLUMN data_schema TEXT;
