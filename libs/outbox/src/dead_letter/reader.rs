//! Reading the dead-letter topics: watermarks, scans and single records,
//! through a consumer that is assigned partitions and never commits.

use super::headers;
use super::model::{
    ActionRecord, DeadLetter, DeadLetterError, ListFilter, MessageId, Page, Position, State, TopicSummary,
};
use super::{BROKER_TIMEOUT, DeadLetters};
use crate::kafka;
use chrono::DateTime;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Arc;

impl DeadLetters {
    /// Every operated topic's counts.
    pub async fn summaries(&self) -> Result<Vec<TopicSummary>, DeadLetterError> {
        let mut out = Vec::new();
        for topic in &self.inner.settings.topics {
            let dlq_topic = self.dlq_topic(topic)?;
            let marks = self.watermarks(&dlq_topic).await?;
            let messages: u64 = marks.iter().map(|(_, low, high)| (high - low).max(0) as u64).sum();
            let acted = self.acted_count(&dlq_topic, &marks).await?;
            out.push(TopicSummary {
                topic: topic.clone(),
                dlq_topic,
                messages,
                pending: messages.saturating_sub(acted),
            });
        }
        Ok(out)
    }

    /// The messages of `topic`'s DLQ after `cursor` that pass `filter`,
    /// oldest first, at most `limit`.
    pub async fn list(
        &self,
        topic: &str,
        filter: &ListFilter,
        cursor: Option<MessageId>,
        limit: usize,
    ) -> Result<Page, DeadLetterError> {
        let dlq_topic = self.dlq_topic(topic)?;
        // Unfiltered, the message after the page is all it takes to know there is more.
        let unfiltered = filter.state.is_none() && filter.key.is_none();
        let max = if unfiltered {
            self.inner.settings.max_scan.min(limit + 1)
        } else {
            self.inner.settings.max_scan
        };
        let (raw, scanned_to) = self.scan(&dlq_topic, cursor, max).await?;
        let actions = self.actions(&dlq_topic, raw.iter().map(|m| m.id)).await?;
        let mut messages = Vec::new();
        let mut next_cursor = scanned_to;
        for m in raw {
            let letter =
                m.into_dead_letter(topic, &dlq_topic, &actions, self.inner.settings.max_payload_bytes);
            if filter.state.is_some_and(|s| s != letter.state)
                || filter.key.as_ref().is_some_and(|k| letter.key.as_ref() != Some(k))
            {
                continue;
            }
            if messages.len() == limit {
                // There is more: the page ends at the last one returned.
                next_cursor = messages.last().map(|l: &DeadLetter| l.id);
                break;
            }
            messages.push(letter);
        }
        Ok(Page { messages, next_cursor })
    }

    /// One message of `topic`'s DLQ.
    pub async fn get(&self, topic: &str, id: MessageId) -> Result<DeadLetter, DeadLetterError> {
        let dlq_topic = self.dlq_topic(topic)?;
        let raw = self.read_one(&dlq_topic, id).await?;
        let actions = self.actions(&dlq_topic, [id]).await?;
        Ok(raw.into_dead_letter(topic, &dlq_topic, &actions, self.inner.settings.max_payload_bytes))
    }

    /// `(partition, low, high)` of every partition of `topic`; none when
    /// the topic does not exist (nothing was dead-lettered into it yet).
    pub(super) async fn watermarks(&self, topic: &str) -> Result<Vec<(i32, i64, i64)>, DeadLetterError> {
        let reader = Arc::clone(&self.inner.reader);
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            let metadata = reader.fetch_metadata(Some(&topic), BROKER_TIMEOUT)?;
            let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else { return Ok(Vec::new()) };
            if t.error().is_some() {
                return Ok(Vec::new());
            }
            let mut marks = Vec::new();
            for p in t.partitions() {
                let (low, high) = reader.fetch_watermarks(&topic, p.id(), BROKER_TIMEOUT)?;
                marks.push((p.id(), low, high));
            }
            marks.sort();
            Ok(marks)
        })
        .await
        .expect("watermark task does not panic")
    }

    /// Reads the messages after `cursor`, at most `max` of them; also
    /// returns where a next scan goes on (`None`: the end was reached).
    pub(super) async fn scan(
        &self,
        dlq_topic: &str,
        cursor: Option<MessageId>,
        max: usize,
    ) -> Result<(Vec<RawMessage>, Option<MessageId>), DeadLetterError> {
        let marks = self.watermarks(dlq_topic).await?;
        let _reading = self.inner.reading.lock().await;
        let mut out = Vec::new();
        for (partition, low, high) in marks {
            let start = match cursor {
                Some(c) if partition < c.partition => continue,
                Some(c) if partition == c.partition => c.offset.saturating_add(1).max(low),
                _ => low,
            };
            if start >= high {
                continue;
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(dlq_topic, partition, Offset::Offset(start))?;
            self.inner.reader.assign(&tpl)?;
            loop {
                let msg = recv(&self.inner.reader).await?;
                if msg.partition() != partition || msg.offset() < start {
                    continue;
                }
                let last = msg.offset() >= high - 1;
                out.push(RawMessage::from(&msg));
                if out.len() >= max {
                    let at = out.last().map(|m| m.id);
                    self.inner.reader.unassign()?;
                    return Ok((out, at));
                }
                if last {
                    break;
                }
            }
        }
        self.inner.reader.unassign()?;
        Ok((out, None))
    }

    pub(super) async fn read_one(
        &self,
        dlq_topic: &str,
        id: MessageId,
    ) -> Result<RawMessage, DeadLetterError> {
        self.read_at(dlq_topic, id).await?.ok_or(DeadLetterError::NotFound(id))
    }

    /// The record of `topic` at `at`, if the topic holds it.
    pub(super) async fn read_at(
        &self,
        topic: &str,
        at: MessageId,
    ) -> Result<Option<RawMessage>, DeadLetterError> {
        let marks = self.watermarks(topic).await?;
        let inside =
            marks.iter().any(|(p, low, high)| *p == at.partition && (*low..*high).contains(&at.offset));
        if !inside {
            return Ok(None);
        }
        let _reading = self.inner.reading.lock().await;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, at.partition, Offset::Offset(at.offset))?;
        self.inner.reader.assign(&tpl)?;
        let found = loop {
            let msg = recv(&self.inner.reader).await?;
            if msg.topic() == topic && msg.partition() == at.partition && msg.offset() >= at.offset {
                break (msg.offset() == at.offset).then(|| RawMessage::from(&msg));
            }
        };
        self.inner.reader.unassign()?;
        Ok(found)
    }
}

/// The next message, or a timeout error if the broker sends none in time.
async fn recv(reader: &StreamConsumer) -> Result<BorrowedMessage<'_>, DeadLetterError> {
    match tokio::time::timeout(BROKER_TIMEOUT, reader.recv()).await {
        Ok(msg) => Ok(msg?),
        Err(_) => {
            Err(DeadLetterError::Kafka(KafkaError::MessageConsumption(RDKafkaErrorCode::RequestTimedOut)))
        }
    }
}

/// A DLQ message as read, before it is shown.
pub(super) struct RawMessage {
    pub(super) id: MessageId,
    pub(super) key: Option<Vec<u8>>,
    pub(super) payload: Option<Vec<u8>>,
    pub(super) headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: Option<i64>,
}

impl RawMessage {
    fn from(msg: &BorrowedMessage<'_>) -> Self {
        let headers = msg
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        Self {
            id: MessageId { partition: msg.partition(), offset: msg.offset() },
            key: msg.key().map(<[u8]>::to_vec),
            payload: msg.payload().map(<[u8]>::to_vec),
            headers,
            timestamp: msg.timestamp().to_millis(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// `(partition, offset)` in the original topic, from the `dlq_original_*` headers.
    pub(super) fn original_position(&self) -> Option<(i32, i64)> {
        let partition = self.header(headers::DLQ_ORIGINAL_PARTITION)?.parse().ok()?;
        let offset = self.header(headers::DLQ_ORIGINAL_OFFSET)?.parse().ok()?;
        Some((partition, offset))
    }

    /// Where in `topic` the `dlq_original_*` headers say this message was
    /// consumed, or why they name no place there.
    pub(super) fn original_in(&self, topic: &str) -> Result<MessageId, String> {
        match self.header(headers::DLQ_ORIGINAL_TOPIC) {
            Some(t) if t == topic => {}
            Some(t) => return Err(format!("it names {t:?} as its original topic, not {topic:?}")),
            None => return Err(format!("it has no {} header", headers::DLQ_ORIGINAL_TOPIC)),
        }
        let (partition, offset) = self.original_position().ok_or_else(|| {
            format!(
                "it has no valid {} and {} headers",
                headers::DLQ_ORIGINAL_PARTITION,
                headers::DLQ_ORIGINAL_OFFSET
            )
        })?;
        Ok(MessageId { partition, offset })
    }

    /// What of this dead letter is not as in `original` (`None`: key, payload
    /// and `ce_*` headers are the same).
    pub(super) fn differs_from(&self, original: &RawMessage) -> Option<String> {
        if self.key != original.key {
            return Some("key".into());
        }
        if self.payload != original.payload {
            return Some("payload".into());
        }
        let ce = |m: &RawMessage| -> Vec<(String, Option<Vec<u8>>)> {
            m.headers.iter().filter(|(k, _)| k.starts_with("ce_")).cloned().collect()
        };
        (ce(self) != ce(original)).then(|| "ce_* headers".into())
    }

    pub(super) fn into_dead_letter(
        self,
        topic: &str,
        dlq_topic: &str,
        actions: &BTreeMap<MessageId, (State, ActionRecord)>,
        max_payload: usize,
    ) -> DeadLetter {
        let original = self.original_position().map(|(partition, offset)| Position {
            topic: self
                .header(headers::DLQ_ORIGINAL_TOPIC)
                .unwrap_or(dlq_topic.trim_end_matches(".dlq"))
                .to_string(),
            partition,
            offset,
        });
        let payload = self.payload.as_deref().unwrap_or_default();
        let shown = &payload[..payload.len().min(max_payload)];
        let (state, actions) = match actions.get(&self.id) {
            Some((state, action)) => (*state, vec![action.clone()]),
            None => (State::Pending, Vec::new()),
        };
        DeadLetter {
            id: self.id,
            topic: topic.to_string(),
            dlq_topic: dlq_topic.to_string(),
            key: self.key.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
            original,
            group: self.header(headers::DLQ_GROUP).map(str::to_string),
            reason: self.header(headers::DLQ_REASON).map(str::to_string),
            error: self.header(headers::DLQ_ERROR).unwrap_or_default().to_string(),
            attempts: self.header(headers::DLQ_ATTEMPTS).and_then(|a| a.parse().ok()).unwrap_or(0),
            dead_lettered_at: self.timestamp.and_then(DateTime::from_timestamp_millis),
            event_id: self.header(kafka::headers::CE_ID).map(str::to_string),
            event_type: self.header(kafka::headers::CE_TYPE).map(str::to_string),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| {
                    (k.clone(), String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
                })
                .collect(),
            payload: String::from_utf8_lossy(shown).into_owned(),
            payload_bytes: payload.len(),
            payload_truncated: payload.len() > shown.len(),
            state,
            actions,
        }
    }
}
