-- The consumer deletes inbox rows older than its retention (consumer.inbox_retention_hours).
CREATE INDEX inbox_processed_at ON inbox (consumer_group, processed_at);
