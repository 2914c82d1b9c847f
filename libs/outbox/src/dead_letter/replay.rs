//! Replay and discard: the pending messages a call selects, checked against
//! their originals, sent back and recorded in one transaction.

use super::audit::record;
use super::headers;
use super::model::{Acted, DeadLetterError, MessageId, Operator, Refusal, Selector, State, refusals};
use super::reader::RawMessage;
use super::{BROKER_TIMEOUT, DeadLetters};
use crate::kafka;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use std::collections::HashSet;

impl DeadLetters {
    /// Sends the pending messages `selector` names back to their original
    /// topic, in their original order, and records it (see the module docs).
    pub async fn replay(
        &self,
        topic: &str,
        selector: Selector,
        operator: &Operator,
    ) -> Result<Acted, DeadLetterError> {
        let dlq_topic = self.dlq_topic(topic)?;
        let original_topic = kafka::topic_name(&self.inner.kafka, topic);
        if let Some(done) = self.earlier(&dlq_topic, "replay", &selector, operator).await? {
            return Ok(done);
        }
        let mut chosen = self.pending(&dlq_topic, &selector).await?;
        // Original order: a key's messages were consumed from one partition,
        // in offset order; DLQ order breaks ties (and orders the messages
        // that lack the original position).
        chosen.sort_by_key(|m| (m.original_position(), m.id));
        let mut tx = self.inner.pool.begin().await?;
        let taken = record(&mut tx, &dlq_topic, "replay", &selector, operator, &chosen).await?;
        let Some(taken) = taken else {
            tx.rollback().await?;
            return self
                .earlier(&dlq_topic, "replay", &selector, operator)
                .await?
                .ok_or(DeadLetterError::KeyReused);
        };
        if let Selector::One(id) = selector
            && !taken.contains(&id)
        {
            return Err(self.not_pending(&dlq_topic, id).await);
        }
        let chosen: Vec<&RawMessage> = chosen.iter().filter(|m| taken.contains(&m.id)).collect();
        let (originals, refused) = self.originals(&original_topic, &chosen).await?;
        if !refused.is_empty() {
            tx.rollback().await?;
            self.record_refusals(&dlq_topic, operator, &refused).await?;
            tracing::warn!(dlq = %dlq_topic, actor = %operator.actor, refused = %refusals(&refused),
                "dead-letter replay refused: not what the topic's publisher wrote");
            return Err(DeadLetterError::Refused(refused));
        }
        let mut sent = HashSet::new();
        let mut ids = Vec::new();
        for (m, original) in chosen.iter().zip(&originals) {
            ids.push(m.id);
            // A message two groups dead-lettered is in the DLQ twice: send it once.
            if !sent.insert(original.id) {
                continue;
            }
            self.send_back(&original_topic, &dlq_topic, m.id, original).await?;
        }
        tx.commit().await?;
        tracing::info!(dlq = %dlq_topic, messages = ids.len(), actor = %operator.actor, reason = %operator.reason,
            "dead letters replayed");
        Ok(Acted { ids, replayed: false })
    }

    /// Records that an operator decided message `id` needs nothing.
    pub async fn discard(
        &self,
        topic: &str,
        id: MessageId,
        operator: &Operator,
    ) -> Result<Acted, DeadLetterError> {
        let dlq_topic = self.dlq_topic(topic)?;
        let selector = Selector::One(id);
        if let Some(done) = self.earlier(&dlq_topic, "discard", &selector, operator).await? {
            return Ok(done);
        }
        let chosen = self.pending(&dlq_topic, &selector).await?;
        let mut tx = self.inner.pool.begin().await?;
        let Some(taken) = record(&mut tx, &dlq_topic, "discard", &selector, operator, &chosen).await? else {
            tx.rollback().await?;
            return self
                .earlier(&dlq_topic, "discard", &selector, operator)
                .await?
                .ok_or(DeadLetterError::KeyReused);
        };
        if !taken.contains(&id) {
            return Err(self.not_pending(&dlq_topic, id).await);
        }
        tx.commit().await?;
        tracing::info!(dlq = %dlq_topic, %id, actor = %operator.actor, reason = %operator.reason, "dead letter discarded");
        Ok(Acted { ids: vec![id], replayed: false })
    }

    /// The pending messages `selector` names (for `One`, the message whatever
    /// its state), from the first `max_scan` messages of the topic.
    async fn pending(
        &self,
        dlq_topic: &str,
        selector: &Selector,
    ) -> Result<Vec<RawMessage>, DeadLetterError> {
        let max = self.inner.settings.max_scan;
        let raw = match selector {
            Selector::One(id) => vec![self.read_one(dlq_topic, *id).await?],
            Selector::Key(key) => {
                let (all, _) = self.scan(dlq_topic, None, max).await?;
                all.into_iter().filter(|m| m.key.as_deref() == Some(key.as_bytes())).collect()
            }
            Selector::AllPending => self.scan(dlq_topic, None, max).await?.0,
        };
        if matches!(selector, Selector::One(_)) {
            return Ok(raw);
        }
        let acted = self.actions(dlq_topic, raw.iter().map(|m| m.id)).await?;
        Ok(raw.into_iter().filter(|m| !acted.contains_key(&m.id)).collect())
    }

    async fn not_pending(&self, dlq_topic: &str, id: MessageId) -> DeadLetterError {
        match self.actions(dlq_topic, [id]).await {
            Ok(actions) => {
                let state = actions.get(&id).map(|(s, _)| *s).unwrap_or(State::Pending);
                DeadLetterError::NotPending { id, state }
            }
            Err(e) => e,
        }
    }

    /// Per message of `chosen`, its original record in `original_topic`, or
    /// why there is none that it matches (see the module docs).
    async fn originals(
        &self,
        original_topic: &str,
        chosen: &[&RawMessage],
    ) -> Result<(Vec<RawMessage>, Vec<Refusal>), DeadLetterError> {
        let mut originals = Vec::with_capacity(chosen.len());
        let mut refused = Vec::new();
        for m in chosen {
            let why = match m.original_in(original_topic) {
                Err(why) => Some(why),
                Ok(at) => match self.read_at(original_topic, at).await? {
                    None => {
                        Some(format!("its original {original_topic}/{}/{} is gone", at.partition, at.offset))
                    }
                    Some(original) => match m.differs_from(&original) {
                        Some(what) => Some(format!(
                            "its {what} differs from its original {original_topic}/{}/{}",
                            at.partition, at.offset
                        )),
                        None => {
                            originals.push(original);
                            None
                        }
                    },
                },
            };
            if let Some(why) = why {
                refused.push(Refusal { id: m.id, why });
            }
        }
        Ok((originals, refused))
    }

    /// Sends `original` (a record read from `original_topic`) to its partition
    /// there again, marked as replayed from dead letter `from`.
    async fn send_back(
        &self,
        original_topic: &str,
        dlq_topic: &str,
        from: MessageId,
        original: &RawMessage,
    ) -> Result<(), DeadLetterError> {
        let from = format!("{dlq_topic}/{}/{}", from.partition, from.offset);
        let mut h = OwnedHeaders::new();
        for (name, value) in &original.headers {
            if !name.starts_with("dlq_") {
                h = h.insert(Header { key: name, value: value.as_deref() });
            }
        }
        h = h.insert(Header { key: headers::DLQ_REPLAYED_FROM, value: Some(&from) });
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(original_topic).partition(original.id.partition).headers(h);
        if let Some(k) = &original.key {
            record = record.key(k);
        }
        if let Some(p) = &original.payload {
            record = record.payload(p);
        }
        self.inner.producer.send(record, BROKER_TIMEOUT).await.map_err(|(e, _)| e)?;
        Ok(())
    }
}
