//! What the consumer calls for each event: the [`Handler`] trait.

#[cfg(doc)]
use super::ConsumerSettings;
use super::ReceivedEvent;
use sqlx::PgConnection;
use tracing::Instrument;

/// Why a handler did not handle an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// Worth another try (a dependency was down, a lock timed out).
    #[error("retryable: {0}")]
    Retryable(String),
    /// Will never succeed (a poison message): dead-letter it at once.
    #[error("permanent: {0}")]
    Permanent(String),
    /// Written with a schema version newer than the handler reads (see
    /// [`Event`](crate::Event)); handled per [`ConsumerSettings::unsupported_schema_version`].
    #[error("unsupported schema version: {0}")]
    UnsupportedSchemaVersion(String),
}

/// Handles one event on the consumer's transaction (which already holds the
/// inbox row): write with `tx`, don't commit it.
pub trait Handler: Send + Sync + 'static {
    /// Whether `handle` has anything to do with `event`. An event it does not
    /// want is acknowledged without touching the database (no transaction, no
    /// inbox row: it has no effect, so there is nothing to deduplicate).
    fn wants(&self, _event: &ReceivedEvent) -> bool {
        true
    }

    /// Implement it as an `async fn` (its future must be `Send`).
    fn handle(
        &self,
        tx: &mut PgConnection,
        event: &ReceivedEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Handles the new events of one transaction (several when `batch_size`
    /// is above 1), in partition order; `spans[i]` is the `process {topic}`
    /// span of `events[i]`. The default runs [`handle`](Self::handle) for each
    /// event inside its span. Override it to write a batch in fewer
    /// statements; an error rolls the whole batch back, and its messages are
    /// then handled one at a time (a batch of one each).
    fn handle_many(
        &self,
        tx: &mut PgConnection,
        events: &[&ReceivedEvent],
        spans: &[tracing::Span],
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        async move {
            for (event, span) in events.iter().zip(spans) {
                self.handle(tx, event).instrument(span.clone()).await?;
            }
            Ok(())
        }
    }
}
