-- The worker's poll (`status IN (...) AND next_attempt_at <= now() AND
-- saga_type = $n ORDER BY next_attempt_at`) was planned as a BitmapAnd of
-- saga_instances_runnable and the (saga_type, key) unique index, and the
-- latter reads an entry for every instance of the type, finished or not: a
-- cost that grew with the table on every poll. With the type in the partial
-- index, the poll (and the stuck count) reads unfinished instances only.
DROP INDEX saga_instances_runnable;
CREATE INDEX saga_instances_runnable ON saga_instances (saga_type, next_attempt_at)
    WHERE status IN ('RUNNING', 'COMPENSATING');
