//! The broker readiness check against a real broker that is then stopped.

use sagaworks_outbox::testing::BrokerCheck;
use sagaworks_runtime::Readiness;
use sagaworks_test_support::{Broker, eventually};
use std::time::Duration;

#[tokio::test]
async fn broker_check_passes_while_the_broker_runs_and_fails_when_it_is_down() {
    let mut broker = Broker::private().await;
    let ready = Readiness::new().with_check(BrokerCheck::new(&broker.kafka_settings()).unwrap());
    // Probed as a kubelet does, again and again: the first probe's metadata request also
    // opens the connection (TLS and SCRAM), which can take longer than the check's second
    // on a busy machine. Once connected, the check passes.
    let e = eventually("the broker check to pass", Duration::from_secs(60), || async {
        let e = ready.evaluate().await;
        e.ready.then_some(e)
    })
    .await;
    assert_eq!(e.checks["kafka"], "ok");

    broker.stop();
    // The contract: with the broker gone the check gives up (its metadata request times
    // out after a second) and reports not ready, instead of hanging the readiness probe.
    // The bound is no measurement, only far enough off to turn a hang into a failure.
    let e = tokio::time::timeout(Duration::from_secs(30), ready.evaluate())
        .await
        .expect("the check gives up instead of hanging");
    assert!(!e.ready, "{e:?}");
    assert!(e.checks["kafka"]["error"].is_string(), "{e:?}");
}
