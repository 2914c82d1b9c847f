//! The broker readiness check against a real broker that is then stopped.

use sagaworks_outbox::BrokerCheck;
use sagaworks_runtime::health::Readiness;
use sagaworks_test_support::Broker;

#[tokio::test]
async fn broker_check_passes_while_the_broker_runs_and_fails_when_it_is_down() {
    let mut broker = Broker::start().await;
    let ready = Readiness::new().with_check(BrokerCheck::new(&broker.kafka_settings()).unwrap());
    let e = ready.evaluate().await;
    assert!(e.ready, "{e:?}");
    assert_eq!(e.checks["kafka"], "ok");

    broker.stop();
    let started = std::time::Instant::now();
    let e = ready.evaluate().await;
    assert!(!e.ready, "{e:?}");
    assert!(e.checks["kafka"]["error"].is_string(), "{e:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "the check gives up after about a second");
}
