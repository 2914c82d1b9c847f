//! Dead letters (`/v1/admin/dlq`): the order service's gRPC answers as the
//! API's bodies (`sagaworks_api::dead_letter`, shared with the admin CLI).

use super::{non_empty, time};
use sagaworks_api::dead_letter::{
    DeadLetter, DeadLetterAction, DeadLetterPage, DlqTopic, DlqTopics, OriginalPosition,
};
use sagaworks_proto::deadletter::v1 as dl;

/// `GET /v1/admin/dlq`.
pub fn dlq_topics(r: dl::ListTopicsResponse) -> DlqTopics {
    DlqTopics {
        topics: r
            .topics
            .into_iter()
            .map(|t| DlqTopic {
                topic: t.topic,
                dlq_topic: t.dlq_topic,
                messages: t.messages,
                pending: t.pending,
            })
            .collect(),
    }
}

/// One dead letter.
pub fn dead_letter(d: dl::DeadLetter) -> DeadLetter {
    DeadLetter {
        id: d.id,
        topic: d.topic,
        dlq_topic: d.dlq_topic,
        key: d.key,
        original: d.original.map(|o| OriginalPosition {
            topic: o.topic,
            partition: o.partition,
            offset: o.offset,
        }),
        group: d.group,
        reason: d.reason,
        error: d.error,
        attempts: d.attempts,
        dead_lettered_at: time(d.dead_lettered_at),
        event_id: d.event_id,
        event_type: d.event_type,
        headers: d.headers.into_iter().collect(),
        payload: d.payload,
        payload_bytes: d.payload_bytes,
        payload_truncated: d.payload_truncated,
        state: d.state,
        actions: d
            .actions
            .into_iter()
            .map(|a| DeadLetterAction { action: a.action, actor: a.actor, reason: a.reason, at: time(a.at) })
            .collect(),
    }
}

/// `GET /v1/admin/dlq/{topic}/messages`.
pub fn dead_letter_page(r: dl::ListDeadLettersResponse) -> DeadLetterPage {
    DeadLetterPage {
        messages: r.messages.into_iter().map(dead_letter).collect(),
        next_cursor: non_empty(r.next_cursor),
    }
}
