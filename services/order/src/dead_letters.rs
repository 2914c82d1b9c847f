//! The `DeadLetterService` gRPC API: operators list, show, replay and discard
//! the messages parked in the system's dead-letter topics
//! (`sagaworks_outbox::dead_letter` does the work; this maps the contract).

use crate::error::{Error, Result};
use sagaworks_errors::status::invalid_argument;
use sagaworks_errors::validate::text;
use sagaworks_outbox::DeadLetters;
use sagaworks_outbox::dead_letter::{self as dl, ListFilter, MessageId, Selector};
use sagaworks_proto::deadletter::v1 as pb;
use sagaworks_proto::deadletter::v1::dead_letter_service_server::DeadLetterService;
use sagaworks_proto::timestamp;
use tonic::{Request, Response, Status};

/// The largest `limit` of a page.
const MAX_LIMIT: u32 = 500;
const DEFAULT_LIMIT: u32 = 50;

pub struct DeadLetterApi {
    dead_letters: DeadLetters,
}

impl DeadLetterApi {
    pub fn new(dead_letters: DeadLetters) -> Self {
        Self { dead_letters }
    }
}

fn message_id(field: &str, value: &str) -> Result<MessageId, Status> {
    value.parse().map_err(|_| invalid_argument(field, "must be <partition>-<offset>"))
}

fn operator(op: Option<pb::Operator>) -> Result<dl::Operator, Status> {
    let op = op.unwrap_or_default();
    Ok(dl::Operator {
        actor: text("actor", &op.actor, 200)?,
        reason: text("reason", &op.reason, 1000)?,
        idempotency_key: text("idempotency_key", &op.idempotency_key, 255)?,
    })
}

fn acted(a: dl::Acted) -> pb::ActResponse {
    pb::ActResponse { ids: a.ids.iter().map(ToString::to_string).collect(), replayed: a.replayed }
}

fn letter(d: dl::DeadLetter) -> pb::DeadLetter {
    pb::DeadLetter {
        id: d.id.to_string(),
        topic: d.topic,
        dlq_topic: d.dlq_topic,
        key: d.key,
        original: d.original.map(|o| pb::Position {
            topic: o.topic,
            partition: o.partition,
            offset: o.offset,
        }),
        group: d.group,
        reason: d.reason,
        error: d.error,
        attempts: d.attempts,
        dead_lettered_at: d.dead_lettered_at.map(timestamp),
        event_id: d.event_id,
        event_type: d.event_type,
        headers: d.headers.into_iter().collect(),
        payload: d.payload,
        payload_bytes: d.payload_bytes as u64,
        payload_truncated: d.payload_truncated,
        state: d.state.as_str().to_string(),
        actions: d
            .actions
            .into_iter()
            .map(|a| pb::DeadLetterAction {
                action: a.action,
                actor: a.actor,
                reason: a.reason,
                at: Some(timestamp(a.at)),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl DeadLetterService for DeadLetterApi {
    async fn list_topics(
        &self,
        _: Request<pb::ListTopicsRequest>,
    ) -> Result<Response<pb::ListTopicsResponse>, Status> {
        let topics = self.dead_letters.summaries().await.map_err(Error::from)?;
        Ok(Response::new(pb::ListTopicsResponse {
            topics: topics
                .into_iter()
                .map(|t| pb::TopicSummary {
                    topic: t.topic,
                    dlq_topic: t.dlq_topic,
                    messages: t.messages,
                    pending: t.pending,
                })
                .collect(),
        }))
    }

    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let r = request.into_inner();
        let filter = ListFilter {
            state: match r.state.as_str() {
                "" => None,
                s => Some(
                    s.parse().map_err(|e: dl::DeadLetterError| invalid_argument("state", e.to_string()))?,
                ),
            },
            key: (!r.key.is_empty()).then_some(r.key),
        };
        let cursor = match r.cursor.as_str() {
            "" => None,
            c => Some(message_id("cursor", c)?),
        };
        let limit = match r.limit {
            0 => DEFAULT_LIMIT,
            n if n <= MAX_LIMIT => n,
            _ => return Err(invalid_argument("limit", format!("must be between 1 and {MAX_LIMIT}"))),
        };
        let page =
            self.dead_letters.list(&r.topic, &filter, cursor, limit as usize).await.map_err(Error::from)?;
        Ok(Response::new(pb::ListDeadLettersResponse {
            messages: page.messages.into_iter().map(letter).collect(),
            next_cursor: page.next_cursor.map(|c| c.to_string()).unwrap_or_default(),
        }))
    }

    async fn get_dead_letter(
        &self,
        request: Request<pb::GetDeadLetterRequest>,
    ) -> Result<Response<pb::DeadLetter>, Status> {
        let r = request.into_inner();
        let id = message_id("id", &r.id)?;
        let found = self.dead_letters.get(&r.topic, id).await.map_err(Error::from)?;
        Ok(Response::new(letter(found)))
    }

    async fn replay(&self, request: Request<pb::ReplayRequest>) -> Result<Response<pb::ActResponse>, Status> {
        use pb::replay_request::Selector as S;
        let r = request.into_inner();
        let operator = operator(r.operator)?;
        let selector = match r.selector {
            Some(S::Id(id)) => Selector::One(message_id("id", &id)?),
            Some(S::Key(key)) if !key.is_empty() => Selector::Key(key),
            Some(S::All(true)) => Selector::AllPending,
            _ => return Err(invalid_argument("selector", "give one of id, key or all = true")),
        };
        let done = self.dead_letters.replay(&r.topic, selector, &operator).await.map_err(Error::from)?;
        Ok(Response::new(acted(done)))
    }

    async fn discard(
        &self,
        request: Request<pb::DiscardRequest>,
    ) -> Result<Response<pb::ActResponse>, Status> {
        let r = request.into_inner();
        let operator = operator(r.operator)?;
        let id = message_id("id", &r.id)?;
        let done = self.dead_letters.discard(&r.topic, id, &operator).await.map_err(Error::from)?;
        Ok(Response::new(acted(done)))
    }
}
