-- The relay deletes a row once the broker acked it (libs/outbox/src/relay.rs,
-- "Published means deleted"): every row in the outbox is unpublished, so the
-- relay's indexes need no `published_at IS NULL` predicate. Without one the
-- planner's estimates follow the table's size; with one they came from the
-- predicate's statistics, which on a queue table are often stale or absent
-- (PostgreSQL then guesses 0.5 % of the rows), and a claim planned on such a
-- guess read the whole backlog once per head (docs/perf-log.md, 2026-12-06).
--
-- Rows relays of earlier versions marked published are on Kafka already.
DELETE FROM outbox WHERE published_at IS NOT NULL;
DROP INDEX outbox_unpublished;
DROP INDEX outbox_unpublished_by_aggregate;
DROP INDEX outbox_published_at;
-- An aggregate's rows in order: its head, and the rows that follow it.
CREATE INDEX outbox_by_aggregate ON outbox (aggregate_id, seq);
-- `published_at` stays for one release: a relay of an earlier version, still
-- running during a rolling upgrade, marks rows instead of deleting them; a new
-- relay publishes those again (a duplicate the consumers' inbox absorbs) and
-- deletes them. Drop the column once no such relay runs.
COMMENT ON COLUMN outbox.published_at IS
    'Set only by relays before 2026-12-06 (they kept published rows); unused since. Drop after the upgrade.';
