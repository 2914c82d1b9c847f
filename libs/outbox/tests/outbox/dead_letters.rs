//! Dead-letter operations end to end against real PostgreSQL and a real
//! broker: two consumer groups read the same topic, one of them fails on an
//! account until the cause is fixed; its messages are listed, replayed in
//! order or discarded, and every action is recorded.

use crate::common::*;
use sagaworks_outbox::dead_letter::{
    DeadLetter, DeadLetterError, ListFilter, MessageId, Operator, Selector, State,
};
use sagaworks_outbox::kafka::topic_name;
use sagaworks_outbox::{
    Consumer, DeadLetterSettings, DeadLetters, Handler, HandlerError, ReceivedEvent, Relay, RelaySettings,
};
use sqlx::{PgConnection, PgPool};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(40);

/// Records each handled event as `(group, account, n)` in `handled`; as
/// group `gated`, refuses (permanently) the accounts listed in `broken`.
#[derive(Clone)]
struct Gate {
    group: &'static str,
    gated: bool,
}

impl Handler for Gate {
    async fn handle(&self, tx: &mut PgConnection, event: &ReceivedEvent) -> Result<(), HandlerError> {
        let p: serde_json::Value = event.json().map_err(|e| HandlerError::Permanent(e.to_string()))?;
        let account = p["account"].as_str().unwrap_or_default().to_string();
        let broken: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM broken WHERE account = $1)")
            .bind(&account)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| HandlerError::Retryable(e.to_string()))?;
        if self.gated && broken {
            return Err(HandlerError::Permanent(format!("account {account} is broken")));
        }
        sqlx::query("INSERT INTO handled (grp, event_id, account, n) VALUES ($1, $2, $3, $4)")
            .bind(self.group)
            .bind(event.id)
            .bind(&account)
            .bind(p["n"].as_i64().unwrap_or_default())
            .execute(&mut *tx)
            .await
            .map_err(|e| HandlerError::Retryable(e.to_string()))?;
        Ok(())
    }
}

async fn handled(pool: &PgPool, group: &str, account: &str) -> Vec<i64> {
    sqlx::query_scalar("SELECT n FROM handled WHERE grp = $1 AND account = $2 ORDER BY k")
        .bind(group)
        .bind(account)
        .fetch_all(pool)
        .await
        .unwrap()
}

fn operator(key: &str, reason: &str) -> Operator {
    Operator { actor: "ops-anna".into(), reason: reason.into(), idempotency_key: key.into() }
}

struct Setup {
    env: Env,
    dead: DeadLetters,
    running: Vec<Running>,
}

/// A relay, group `a` (gated by `broken`) and group `b`, and the dead
/// letters of topic `account`.
async fn setup(name: &str) -> Setup {
    let env = env(name).await;
    for sql in [
        "CREATE TABLE broken (account TEXT PRIMARY KEY)",
        "CREATE TABLE handled (k BIGSERIAL, grp TEXT NOT NULL, event_id UUID NOT NULL, account TEXT NOT NULL, n BIGINT NOT NULL)",
    ] {
        sqlx::query(sql).execute(&env.pool).await.unwrap();
    }
    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let a = Consumer::new(
        env.pool.clone(),
        &env.kafka,
        consumer_settings("a", &["account"]),
        Gate { group: "a", gated: true },
    )
    .unwrap();
    let b = Consumer::new(
        env.pool.clone(),
        &env.kafka,
        consumer_settings("b", &["account"]),
        Gate { group: "b", gated: false },
    )
    .unwrap();
    let running =
        vec![Running::spawn(|t| relay.run(t)), Running::spawn(|t| a.run(t)), Running::spawn(|t| b.run(t))];
    let settings = DeadLetterSettings { topics: vec!["account".into()], ..Default::default() };
    let dead = DeadLetters::new(env.pool.clone(), &env.kafka, settings).unwrap();
    Setup { env, dead, running }
}

impl Setup {
    async fn stop(self) {
        for r in self.running {
            r.stop().await;
        }
    }

    async fn wait_pending(&self, n: u64) {
        let dead = self.dead.clone();
        sagaworks_test_support::eventually(&format!("{n} pending dead letters"), WAIT, || {
            let dead = dead.clone();
            async move {
                let s = dead.summaries().await.ok()?;
                (s[0].pending == n).then_some(())
            }
        })
        .await;
    }

    async fn wait_handled(&self, group: &str, account: &str, n: usize) -> Vec<i64> {
        let pool = self.env.pool.clone();
        sagaworks_test_support::eventually(
            &format!("{n} events of {account} handled by {group}"),
            WAIT,
            || {
                let pool = pool.clone();
                async move {
                    let got = handled(&pool, group, account).await;
                    (got.len() >= n).then_some(got)
                }
            },
        )
        .await
    }

    async fn list(&self, filter: ListFilter) -> Vec<DeadLetter> {
        self.dead.list("account", &filter, None, 100).await.unwrap().messages
    }

    /// Waits until group `group` has committed every message now in the
    /// `account` topic: whatever it was sent, it has handled (or skipped).
    async fn wait_caught_up(&self, group: &str) {
        let topic = topic_name(&self.env.kafka, "account");
        let want = high_watermarks(&self.env.kafka, &topic).await;
        let kafka = self.env.kafka.clone();
        sagaworks_test_support::eventually(&format!("group {group} caught up"), WAIT, || {
            let (kafka, topic, want) = (kafka.clone(), topic.clone(), want.clone());
            async move {
                let got = committed(&kafka, group, &topic).await;
                want.iter().all(|(p, w)| *w == 0 || got.get(p).copied().flatten() >= Some(*w)).then_some(())
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_replayed_after_the_fix_is_handled_once_each_in_order_and_a_no_op_where_it_was_handled() {
    let s = setup("dlq_replay").await;
    sqlx::query("INSERT INTO broken VALUES ('acc-x'), ('acc-z')").execute(&s.env.pool).await.unwrap();
    for n in 1..=3 {
        credit(&s.env.pool, "acc-x", n, true).await;
    }
    credit(&s.env.pool, "acc-y", 4, true).await;
    credit(&s.env.pool, "acc-z", 5, true).await;
    s.wait_pending(4).await;
    assert_eq!(s.wait_handled("b", "acc-x", 3).await, vec![1, 2, 3], "group b was never gated");
    // Group a handles acc-y on its own time: wait for it, then check it did so once.
    assert_eq!(s.wait_handled("a", "acc-y", 1).await.len(), 1);

    // What an operator sees.
    let all = s.list(ListFilter::default()).await;
    assert_eq!(all.len(), 4, "{all:#?}");
    let xs = s.list(ListFilter { key: Some("acc-x".into()), ..Default::default() }).await;
    let ns: Vec<i64> = xs
        .iter()
        .map(|m| serde_json::from_str::<serde_json::Value>(&m.payload).unwrap()["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, vec![1, 2, 3], "a key's messages in their order");
    let first = &xs[0];
    assert_eq!(first.error, "account acc-x is broken");
    assert_eq!(first.reason.as_deref(), Some("rejected"));
    assert_eq!((first.group.as_deref(), first.attempts, first.state), (Some("a"), 1, State::Pending));
    assert_eq!(first.event_type.as_deref(), Some("AccountCredited"));
    assert!(first.event_id.is_some() && first.dead_lettered_at.is_some());
    let original = first.original.as_ref().expect("original position");
    assert_eq!(original.topic, topic_name(&s.env.kafka, "account"));
    assert_eq!(first.dlq_topic, format!("{}.dlq", original.topic));
    assert!(
        first.headers.get("ce_type").map(String::as_str) == Some("AccountCredited")
            && first.headers.contains_key("dlq_error")
    );
    assert_eq!(s.dead.get("account", first.id).await.unwrap(), *first);

    // The cause is fixed; the operator replays acc-x.
    sqlx::query("DELETE FROM broken WHERE account = 'acc-x'").execute(&s.env.pool).await.unwrap();
    let done =
        s.dead.replay("account", Selector::Key("acc-x".into()), &operator("k1", "fixed")).await.unwrap();
    assert_eq!(done.ids, xs.iter().map(|m| m.id).collect::<Vec<_>>());
    assert!(!done.replayed);
    assert_eq!(s.wait_handled("a", "acc-x", 3).await, vec![1, 2, 3], "handled once each, in order");
    s.wait_caught_up("a").await;
    s.wait_caught_up("b").await;
    assert_eq!(handled(&s.env.pool, "a", "acc-x").await, vec![1, 2, 3], "once each");
    assert_eq!(handled(&s.env.pool, "b", "acc-x").await, vec![1, 2, 3], "a no-op where it was handled");

    // Recorded, and answered again for the same key; the state shows.
    let again =
        s.dead.replay("account", Selector::Key("acc-x".into()), &operator("k1", "fixed")).await.unwrap();
    assert_eq!((again.ids.clone(), again.replayed), (done.ids.clone(), true));
    let reused = s.dead.replay("account", Selector::AllPending, &operator("k1", "fixed")).await;
    assert!(matches!(reused, Err(DeadLetterError::KeyReused)), "{reused:?}");
    let twice = s.dead.replay("account", Selector::One(first.id), &operator("k2", "again")).await;
    assert!(matches!(twice, Err(DeadLetterError::NotPending { state: State::Replayed, .. })), "{twice:?}");
    let replayed = s.list(ListFilter { state: Some(State::Replayed), ..Default::default() }).await;
    assert_eq!(replayed.len(), 3);
    assert_eq!(
        (
            replayed[0].actions[0].action.as_str(),
            replayed[0].actions[0].actor.as_str(),
            replayed[0].actions[0].reason.as_str()
        ),
        ("replay", "ops-anna", "fixed")
    );
    let summary = &s.dead.summaries().await.unwrap()[0];
    assert_eq!((summary.messages, summary.pending), (4, 1));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discarded_message_is_recorded_and_no_longer_replayed() {
    let s = setup("dlq_discard").await;
    sqlx::query("INSERT INTO broken VALUES ('acc-q')").execute(&s.env.pool).await.unwrap();
    credit(&s.env.pool, "acc-q", 1, true).await;
    credit(&s.env.pool, "acc-q", 2, true).await;
    s.wait_pending(2).await;
    let qs = s.list(ListFilter::default()).await;

    let done = s.dead.discard("account", qs[0].id, &operator("d1", "test order, not needed")).await.unwrap();
    assert_eq!((done.ids.clone(), done.replayed), (vec![qs[0].id], false));
    assert!(
        s.dead
            .discard("account", qs[0].id, &operator("d1", "test order, not needed"))
            .await
            .unwrap()
            .replayed
    );
    let again = s.dead.discard("account", qs[0].id, &operator("d2", "again")).await;
    assert!(matches!(again, Err(DeadLetterError::NotPending { state: State::Discarded, .. })), "{again:?}");
    let missing = MessageId { partition: qs[0].id.partition, offset: 9_999 };
    assert!(matches!(s.dead.get("account", missing).await, Err(DeadLetterError::NotFound(_))));
    assert!(matches!(s.dead.get("nope", qs[0].id).await, Err(DeadLetterError::UnknownTopic(_))));

    // Replaying everything pending takes only the other one.
    sqlx::query("DELETE FROM broken").execute(&s.env.pool).await.unwrap();
    let all = s.dead.replay("account", Selector::AllPending, &operator("r1", "fixed")).await.unwrap();
    assert_eq!(all.ids, vec![qs[1].id]);
    assert_eq!(s.wait_handled("a", "acc-q", 1).await, vec![2]);
    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT action, actor, reason FROM dead_letter_requests ORDER BY at, action")
            .fetch_all(&s.env.pool)
            .await
            .unwrap();
    assert_eq!(
        audit,
        vec![
            ("discard".into(), "ops-anna".into(), "test order, not needed".into()),
            ("replay".into(), "ops-anna".into(), "fixed".into())
        ]
    );

    // Pages: one message each, then the end.
    let page = s.dead.list("account", &ListFilter::default(), None, 1).await.unwrap();
    assert_eq!(page.messages[0].id, qs[0].id);
    let next = s.dead.list("account", &ListFilter::default(), page.next_cursor, 1).await.unwrap();
    assert_eq!(next.messages[0].id, qs[1].id);
    assert_eq!(next.next_cursor, None, "the last page");
    s.stop().await;
}

/// The forgery a compromised consumer of a topic can make: its own Kafka user may write
/// the topic's `.dlq`, so it plants dead letters there that claim the publisher's
/// source and a believable original position. On a broker that enforces the ACLs of
/// services.toml, inventory's user plants two on `order.dlq`; a replay of everything
/// pending (as order, the dead-letter host) refuses them, records the refusal, and sends
/// nothing to `order`. Once they are discarded, the genuine dead letter replays: what
/// reaches `order` is its original record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_forged_by_another_services_user_is_refused_audited_and_never_replayed() {
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use sagaworks_outbox::{NewEvent, OutboxWriter};

    let env = env_on("dlq_forged", sagaworks_test_support::Broker::secured().await).await;
    let (order, inventory) =
        (env.broker.kafka_settings_as("order"), env.broker.kafka_settings_as("inventory"));
    let topic = topic_name(&env.kafka, "order");
    let dlq = format!("{topic}.dlq");
    let one = sagaworks_outbox::kafka::TopicSettings { partitions: 1, replication_factor: 1 };
    sagaworks_outbox::kafka::ensure_topics(&env.kafka, &[topic.clone(), dlq.clone()], one).await.unwrap();

    // Order publishes an event; its timeline group rejects it: a genuine dead letter.
    let mut tx = env.pool.begin().await.unwrap();
    let event = NewEvent::new("order", "o-1", "OrderConfirmed", serde_json::json!({ "n": 1 })).unwrap();
    OutboxWriter::new("order").append(&mut tx, event).await.unwrap();
    tx.commit().await.unwrap();
    let relay =
        Relay::new(env.pool.clone(), &order, RelaySettings { service: "order".into(), ..relay_settings() })
            .unwrap();
    let script = Script { permanent: vec![1], ..Default::default() };
    let timeline = Consumer::new(
        env.pool.clone(),
        &order,
        consumer_settings("order-timeline", &["order"]),
        Recorder { script, ..Default::default() },
    )
    .unwrap();
    let running = [Running::spawn(|t| relay.run(t)), Running::spawn(|t| timeline.run(t))];
    let genuine = read_topic(&env.kafka, &dlq, WAIT, |m| !m.is_empty()).await.remove(0);
    for r in running {
        r.stop().await;
    }

    // Inventory's user plants two: a copy with another payload and a fresh id, and a
    // copy whose original position is past the end of `order`.
    let forge = |payload: &'static str, offset: &'static str| {
        let mut h = OwnedHeaders::new();
        for x in genuine.headers().unwrap().iter() {
            let value = match x.key {
                "ce_id" => Some(uuid::Uuid::now_v7().to_string().into_bytes()),
                "dlq_original_offset" => Some(offset.as_bytes().to_vec()),
                _ => x.value.map(<[u8]>::to_vec),
            };
            h = h.insert(Header { key: x.key, value: value.as_deref() });
        }
        (h, payload)
    };
    let producer: FutureProducer =
        sagaworks_outbox::kafka::client_config(&inventory, &[("acks", "all")]).create().unwrap();
    for (h, payload) in [forge(r#"{"n":2}"#, "0"), forge(r#"{"n":1}"#, "999")] {
        let record = FutureRecord::to(&dlq).key("o-1").payload(payload).headers(h);
        producer.send(record, Duration::from_secs(10)).await.expect("inventory may write order's DLQ");
    }

    let dead = DeadLetters::new(
        env.pool.clone(),
        &order,
        DeadLetterSettings { topics: vec!["order".into()], ..Default::default() },
    )
    .unwrap();
    let listed = dead.list("order", &ListFilter::default(), None, 10).await.unwrap().messages;
    assert_eq!(listed.len(), 3, "{listed:#?}");
    assert!(listed.iter().all(|m| m.headers["ce_source"] == "/sagaworks/order"), "they look alike");
    let before = high_watermarks(&env.kafka, &topic).await;

    let refused = dead.replay("order", Selector::AllPending, &operator("all-1", "replay all")).await;
    let Err(DeadLetterError::Refused(refusals)) = refused else { panic!("not refused: {refused:?}") };
    let whys: Vec<(MessageId, &str)> = refusals.iter().map(|r| (r.id, r.why.as_str())).collect();
    assert_eq!(whys.len(), 2, "{whys:?}");
    assert_eq!(whys[0].0, listed[1].id);
    assert!(whys[0].1.starts_with("its payload differs from its original"), "{whys:?}");
    assert_eq!(whys[1].0, listed[2].id);
    assert!(whys[1].1.contains("is gone"), "{whys:?}");
    assert_eq!(high_watermarks(&env.kafka, &topic).await, before, "nothing reached order");
    let audit: Vec<(i64, String, String, String)> = sqlx::query_as(
        "SELECT dlq_offset, actor, reason, why FROM dead_letter_refusals WHERE dlq_topic = $1 ORDER BY dlq_offset",
    )
    .bind(&dlq)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let audited: Vec<(i64, &str, &str, &str)> =
        audit.iter().map(|(o, a, r, w)| (*o, a.as_str(), r.as_str(), w.as_str())).collect();
    assert_eq!(
        audited,
        vec![
            (listed[1].id.offset, "ops-anna", "replay all", whys[0].1),
            (listed[2].id.offset, "ops-anna", "replay all", whys[1].1),
        ]
    );
    assert_eq!(count(&env.pool, "SELECT count(*) FROM dead_letter_requests").await, 0, "no replay recorded");
    let pending = ListFilter { state: Some(State::Pending), ..Default::default() };
    assert_eq!(dead.list("order", &pending, None, 10).await.unwrap().messages.len(), 3, "all stay pending");

    // Discarded, the forgeries leave the genuine one, which replays its original.
    for (k, m) in listed[1..].iter().enumerate() {
        dead.discard("order", m.id, &operator(&format!("d{k}"), "forged")).await.unwrap();
    }
    let done = dead.replay("order", Selector::AllPending, &operator("all-2", "replay all")).await.unwrap();
    assert_eq!(done.ids, vec![listed[0].id]);
    let on_order = read_topic(&env.kafka, &topic, WAIT, |m| m.len() >= 2).await;
    assert_eq!(on_order.len(), 2, "the original and its replay");
    let (original, replayed) = (&on_order[0], &on_order[1]);
    let from = format!("{dlq}/{}/{}", listed[0].id.partition, listed[0].id.offset);
    assert_eq!(header(replayed, "dlq_replayed_from"), Some(from.as_str()));
    assert_eq!((replayed.key(), replayed.payload()), (original.key(), original.payload()));
    assert_eq!(header(replayed, "ce_id"), header(original, "ce_id"));
}
