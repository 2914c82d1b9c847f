//! [`Replicas`]: the transport of a downstream that runs as several replicas (several
//! URLs in `url`), under the per-attempt timeout, so every attempt, a retried one too,
//! picks a replica of its own.
//!
//! * **Power of two choices**: an attempt goes to the replica with fewer attempts in
//!   flight of two picked at random (tower's p2c rule, the one `tonic`'s own balancer
//!   uses), which keeps a slow replica from collecting a queue.
//! * **Ejection** (Envoy's outlier detection, the consecutive-connect-failure flavour):
//!   a replica whose attempt could not connect (refused, connect timeout: see
//!   [`crate::sent`]) is left out of the picks for [`EJECT_BASE`], doubled for each
//!   ejection in a row up to [`EJECT_MAX`]; its first attempt after that which connects
//!   clears the record. The retry above then lands on a live replica instead of the
//!   dead one again. When every replica is ejected, all are picked from: refusing every
//!   call would be worse than trying.
//!
//! Not `tonic::transport::Channel::balance_list`: its lazily connected endpoints report
//! themselves ready after a failed connect and fail the next call, so a replica that is
//! down keeps getting its share of attempts, and the downstream's breaker (shared by the
//! replicas) opens on a two-replica set with one down, which
//! `a_replica_that_is_down_leaves_the_calls_to_the_others` (`tests/grpc.rs`) rules out.

use crate::BoxError;
use crate::sent::is_connect_failure;
use futures::future::BoxFuture;
use http::{Request, Response};
use rand::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tonic::body::Body;
use tower::ServiceExt;

/// How long a replica is left out after its first connect failure in a row.
pub(crate) const EJECT_BASE: Duration = Duration::from_secs(1);
/// The longest ejection (the base doubles per ejection in a row up to this).
pub(crate) const EJECT_MAX: Duration = Duration::from_secs(30);

/// One replica: its transport, the attempts in flight on it, its ejection record.
struct Replica<T> {
    url: String,
    transport: T,
    in_flight: AtomicUsize,
    ejection: Mutex<Ejection>,
}

#[derive(Default)]
struct Ejection {
    /// Connect failures in a row (ejections, each doubling the next one's length).
    in_a_row: u32,
    until: Option<Instant>,
}

impl Ejection {
    fn is_ejected(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// Records a connect failure; returns how long the replica is now left out.
    fn failed(&mut self, now: Instant) -> Duration {
        let factor = 1u32 << self.in_a_row.min(16);
        let length = EJECT_BASE.saturating_mul(factor).min(EJECT_MAX);
        self.in_a_row = self.in_a_row.saturating_add(1);
        self.until = Some(now + length);
        length
    }
}

/// The replicas of one downstream as one transport (see the module docs).
pub(crate) struct Replicas<T> {
    downstream: &'static str,
    replicas: Arc<[Replica<T>]>,
}

impl<T> Clone for Replicas<T> {
    fn clone(&self) -> Self {
        Self { downstream: self.downstream, replicas: Arc::clone(&self.replicas) }
    }
}

impl<T> Replicas<T> {
    /// `replicas`: each replica's URL (for logs and metrics) and transport; at least one.
    pub fn new(downstream: &'static str, replicas: Vec<(String, T)>) -> Self {
        assert!(!replicas.is_empty(), "a downstream has at least one replica");
        for (url, _) in &replicas {
            metrics::counter!("resilience_replica_ejections_total", "downstream" => downstream,
                "replica" => url.clone())
            .absolute(0);
        }
        let replicas = replicas
            .into_iter()
            .map(|(url, transport)| Replica {
                url,
                transport,
                in_flight: AtomicUsize::new(0),
                ejection: Mutex::new(Ejection::default()),
            })
            .collect();
        Self { downstream, replicas }
    }

    /// The replica for the next attempt: of two picked at random among those not
    /// ejected (among all when every one is), the one with fewer attempts in flight.
    fn pick(&self, now: Instant) -> usize {
        let live: Vec<usize> =
            (0..self.replicas.len()).filter(|i| !lock(&self.replicas[*i].ejection).is_ejected(now)).collect();
        let from: Vec<usize> = if live.is_empty() { (0..self.replicas.len()).collect() } else { live };
        if from.len() == 1 {
            return from[0];
        }
        let mut rng = rand::rng();
        let a = rng.random_range(0..from.len());
        let b = (a + rng.random_range(1..from.len())) % from.len();
        let load = |i: usize| self.replicas[from[i]].in_flight.load(Ordering::Relaxed);
        if load(b) < load(a) { from[b] } else { from[a] }
    }
}

fn lock(m: &Mutex<Ejection>) -> std::sync::MutexGuard<'_, Ejection> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts an attempt in flight on a replica until dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T> tower::Service<Request<Body>> for Replicas<T>
where
    T: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + Sync + 'static,
    T::Error: Into<BoxError> + Send,
    T::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;

    /// Always ready: the attempt waits for its replica's readiness itself.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let i = this.pick(Instant::now());
            let replica = &this.replicas[i];
            replica.in_flight.fetch_add(1, Ordering::Relaxed);
            let _in_flight = InFlight(&replica.in_flight);
            let result = match replica.transport.clone().ready_oneshot().await {
                Ok(ready) => ready.oneshot(req).await.map_err(Into::into),
                Err(e) => Err(e.into()),
            };
            let mut ejection = lock(&replica.ejection);
            match &result {
                Err(e) if is_connect_failure(e.as_ref()) => {
                    let length = ejection.failed(Instant::now());
                    drop(ejection);
                    metrics::counter!("resilience_replica_ejections_total", "downstream" => this.downstream,
                        "replica" => replica.url.clone())
                    .increment(1);
                    tracing::warn!(downstream = this.downstream, replica = %replica.url, error = %e,
                        ejected_for = ?length, "cannot connect to a replica; leaving it out");
                }
                // It connected: whatever the answer, the replica is there.
                _ => *ejection = Ejection::default(),
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tower::Service;

    type Transport = tower::util::BoxCloneSyncService<Request<Body>, Response<Body>, BoxError>;

    /// A replica that counts its attempts; refuses connections while `down` is set;
    /// answers after `delay` otherwise.
    fn replica(calls: Arc<AtomicUsize>, down: Arc<AtomicBool>, delay: Duration) -> Transport {
        Transport::new(tower::service_fn(move |_req: Request<Body>| {
            calls.fetch_add(1, Ordering::SeqCst);
            let down = down.load(Ordering::SeqCst);
            async move {
                if down {
                    let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                    return Err::<Response<Body>, BoxError>(Box::new(tonic::ConnectError(Box::new(io))));
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok(Response::new(Body::empty()))
            }
        }))
    }

    fn req() -> Request<Body> {
        Request::builder().uri("http://x/svc/M").body(Body::empty()).unwrap()
    }

    struct Set {
        replicas: Replicas<Transport>,
        calls: Vec<Arc<AtomicUsize>>,
        down: Vec<Arc<AtomicBool>>,
    }

    fn set(delays: &[Duration]) -> Set {
        let calls: Vec<_> = delays.iter().map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let down: Vec<_> = delays.iter().map(|_| Arc::new(AtomicBool::new(false))).collect();
        let replicas = delays
            .iter()
            .enumerate()
            .map(|(i, d)| (format!("r{i}"), replica(calls[i].clone(), down[i].clone(), *d)))
            .collect();
        Set { replicas: Replicas::new("test", replicas), calls, down }
    }

    fn count(c: &Arc<AtomicUsize>) -> usize {
        c.load(Ordering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_refuses_is_left_out_for_a_doubling_while_then_tried_again() {
        let mut s = set(&[Duration::ZERO, Duration::ZERO]);
        s.down[1].store(true, Ordering::SeqCst);
        // Until r1 is picked once, every call goes through; that one fails and ejects it.
        let mut failures = 0;
        for _ in 0..100 {
            if s.replicas.call(req()).await.is_err() {
                failures += 1;
            }
        }
        assert_eq!(failures, 1, "one failed attempt, then r1 is left out");
        assert_eq!(count(&s.calls[1]), 1);
        // Still ejected just before the base; tried again after it, and ejected for twice as long.
        tokio::time::advance(EJECT_BASE - Duration::from_millis(1)).await;
        for _ in 0..50 {
            s.replicas.call(req()).await.unwrap();
        }
        assert_eq!(count(&s.calls[1]), 1, "left out for EJECT_BASE");
        tokio::time::advance(Duration::from_millis(1)).await;
        while count(&s.calls[1]) < 2 {
            let _ = s.replicas.call(req()).await;
        }
        tokio::time::advance(EJECT_BASE * 2 - Duration::from_millis(1)).await;
        for _ in 0..50 {
            s.replicas.call(req()).await.unwrap();
        }
        assert_eq!(count(&s.calls[1]), 2, "the second ejection in a row lasts twice as long");
        // Back up: once its ejection ends it gets calls, and a success clears its record.
        s.down[1].store(false, Ordering::SeqCst);
        tokio::time::advance(Duration::from_millis(1)).await;
        for _ in 0..200 {
            s.replicas.call(req()).await.unwrap();
        }
        assert!(count(&s.calls[1]) > 20, "r1 is back in the picks: {}", count(&s.calls[1]));
        assert_eq!(lock(&s.replicas.replicas[1].ejection).in_a_row, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn with_every_replica_ejected_all_are_tried() {
        let mut s = set(&[Duration::ZERO, Duration::ZERO]);
        for d in &s.down {
            d.store(true, Ordering::SeqCst);
        }
        for _ in 0..20 {
            assert!(s.replicas.call(req()).await.is_err());
        }
        assert_eq!(count(&s.calls[0]) + count(&s.calls[1]), 20, "no call refused without an attempt");
        s.down[0].store(false, Ordering::SeqCst);
        // Both still ejected: the picks include the one that is back.
        let mut ok = 0;
        for _ in 0..20 {
            ok += usize::from(s.replicas.call(req()).await.is_ok());
        }
        assert!(ok > 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_replica_with_fewer_attempts_in_flight_is_picked() {
        // r0 answers in 10 s, r1 at once: r0's attempts pile up, so p2c picks r1 whenever
        // r0 has any in flight, and r0 gets at most one of the concurrent calls.
        let s = set(&[Duration::from_secs(10), Duration::ZERO]);
        let calls: Vec<_> = (0..20)
            .map(|_| {
                let mut r = s.replicas.clone();
                tokio::spawn(async move { r.call(req()).await.map(|_| ()).map_err(|e| e.to_string()) })
            })
            .collect();
        // Let r1's instant answers in while r0's are pending.
        tokio::task::yield_now().await;
        while count(&s.calls[0]) + count(&s.calls[1]) < 20 {
            tokio::task::yield_now().await;
        }
        assert!(count(&s.calls[0]) <= 1, "r0 got {} of 20 while it was busy", count(&s.calls[0]));
        for c in calls {
            c.await.unwrap().unwrap();
        }
    }

    #[test]
    fn ejections_double_up_to_the_cap() {
        let now = Instant::now();
        let mut e = Ejection::default();
        let lengths: Vec<Duration> = (0..8).map(|_| e.failed(now)).collect();
        assert_eq!(lengths[..3], [EJECT_BASE, EJECT_BASE * 2, EJECT_BASE * 4]);
        assert_eq!(*lengths.last().unwrap(), EJECT_MAX);
        assert!(e.is_ejected(now + EJECT_MAX - Duration::from_millis(1)));
        assert!(!e.is_ejected(now + EJECT_MAX));
    }
}
