//! Circuit breaker with Resilience4j semantics (count-based sliding window).
//!
//! * **Closed**: every attempt runs; its result goes into a window of the last
//!   `sliding_window_size` results. Once at least `minimum_calls` are recorded, the
//!   breaker opens when the failure rate or the slow-call rate reaches its threshold.
//! * **Open**: attempts are rejected at once, without I/O, with `UNAVAILABLE` marked
//!   `circuit_open:<retry_after_ms>`. After `wait_duration_open_ms` the next attempt
//!   moves it to half-open.
//! * **Half-open**: `permitted_calls_half_open` probes run, further attempts are rejected.
//!   When all probes have finished, it closes if their failure rate (and slow-call rate)
//!   is under the threshold, else it opens again.
//!
//! Failures are transport errors, timeouts, `UNAVAILABLE`, `DEADLINE_EXCEEDED`,
//! `INTERNAL` and `UNKNOWN`; business codes are successes. A result is only recorded in
//! the state it was admitted in (an epoch counter drops late results of an older state),
//! and a probe whose future is dropped unfinished gives its half-open slot back.
//!
//! Time is `tokio::time::Instant`, so the state machine is tested with paused time.
//! Transitions are logged (`warn!`), counted (`resilience_breaker_transitions_total`)
//! and exported as the gauge `resilience_breaker_state` (0 closed, 1 open, 2 half-open).

use crate::outcome::Outcome;
use crate::rejection::{Rejection, reject};
use crate::{BoxError, BreakerSettings};
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// State of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Calls flow; results are recorded.
    Closed,
    /// Calls are rejected at once.
    Open,
    /// A few probe calls decide whether to close or re-open.
    HalfOpen,
}

/// Creates `resilience_breaker_transitions_total` at 0 for every transition of
/// `downstream`'s breaker, and its state gauge at closed.
pub(crate) fn register_metrics(downstream: &'static str) {
    use CircuitState::*;
    for (from, to) in [(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed), (HalfOpen, Open)] {
        metrics::counter!("resilience_breaker_transitions_total",
            "downstream" => downstream, "from" => from.label(), "to" => to.label())
        .absolute(0);
    }
}

impl CircuitState {
    fn label(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }

    fn gauge(self) -> f64 {
        match self {
            CircuitState::Closed => 0.0,
            CircuitState::Open => 1.0,
            CircuitState::HalfOpen => 2.0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Record {
    failure: bool,
    slow: bool,
}

#[derive(Debug)]
enum Phase {
    Closed { window: VecDeque<Record> },
    Open { until: Instant },
    HalfOpen { admitted: usize, results: Vec<Record> },
}

#[derive(Debug)]
struct State {
    phase: Phase,
    /// Bumped on every transition; a permit only records into the epoch it was issued in.
    epoch: u64,
}

/// The breaker of one downstream, shared by every clone of its channel.
#[derive(Debug)]
pub(crate) struct Breaker {
    downstream: &'static str,
    settings: BreakerSettings,
    state: Mutex<State>,
}

/// Admission to run one attempt; hand the result to [`Permit::record`].
#[derive(Debug)]
pub(crate) struct Permit {
    breaker: Arc<Breaker>,
    epoch: u64,
    started: Instant,
    probe: bool,
    recorded: bool,
}

impl Breaker {
    pub(crate) fn new(downstream: &'static str, settings: BreakerSettings) -> Arc<Self> {
        metrics::gauge!("resilience_breaker_state", "downstream" => downstream)
            .set(CircuitState::Closed.gauge());
        Arc::new(Self {
            downstream,
            settings,
            state: Mutex::new(State { phase: Phase::Closed { window: VecDeque::new() }, epoch: 0 }),
        })
    }

    pub(crate) fn state(&self) -> CircuitState {
        match self.lock().phase {
            Phase::Closed { .. } => CircuitState::Closed,
            Phase::Open { .. } => CircuitState::Open,
            Phase::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// Admits an attempt, or says how long the caller should wait.
    pub(crate) fn acquire(self: &Arc<Self>) -> Result<Permit, Duration> {
        let now = Instant::now();
        let mut st = self.lock();
        if let Phase::Open { until } = st.phase {
            if now < until {
                return Err(until - now);
            }
            self.transition(&mut st, Phase::HalfOpen { admitted: 0, results: Vec::new() });
        }
        let probe = match &mut st.phase {
            Phase::Closed { .. } => false,
            Phase::HalfOpen { admitted, .. } if *admitted < self.settings.permitted_calls_half_open => {
                *admitted += 1;
                true
            }
            // Half-open with every probe slot taken (or open, handled above).
            _ => return Err(self.wait()),
        };
        Ok(Permit { breaker: Arc::clone(self), epoch: st.epoch, started: now, probe, recorded: false })
    }

    fn record(&self, permit_epoch: u64, record: Record) {
        let mut st = self.lock();
        if st.epoch != permit_epoch {
            return;
        }
        let s = &self.settings;
        let next = match &mut st.phase {
            Phase::Closed { window } => {
                window.push_back(record);
                while window.len() > s.sliding_window_size {
                    window.pop_front();
                }
                let needed = s.minimum_calls.min(s.sliding_window_size);
                (window.len() >= needed && self.exceeds(window.iter())).then(|| self.open_phase())
            }
            Phase::HalfOpen { results, .. } => {
                results.push(record);
                if results.len() < s.permitted_calls_half_open {
                    None
                } else if self.exceeds(results.iter()) {
                    Some(self.open_phase())
                } else {
                    Some(Phase::Closed { window: VecDeque::new() })
                }
            }
            Phase::Open { .. } => None,
        };
        if let Some(phase) = next {
            self.transition(&mut st, phase);
        }
    }

    /// Gives back the half-open slot of a probe that never finished.
    fn release(&self, permit_epoch: u64) {
        let mut st = self.lock();
        if st.epoch == permit_epoch
            && let Phase::HalfOpen { admitted, .. } = &mut st.phase
        {
            *admitted = admitted.saturating_sub(1);
        }
    }

    fn exceeds<'a>(&self, records: impl ExactSizeIterator<Item = &'a Record> + Clone) -> bool {
        let total = records.len() as f64;
        if total == 0.0 {
            return false;
        }
        let failures = records.clone().filter(|r| r.failure).count() as f64;
        let slow = records.filter(|r| r.slow).count() as f64;
        failures * 100.0 / total >= self.settings.failure_rate_threshold
            || slow * 100.0 / total >= self.settings.slow_call_rate_threshold
    }

    fn wait(&self) -> Duration {
        Duration::from_millis(self.settings.wait_duration_open_ms)
    }

    fn open_phase(&self) -> Phase {
        Phase::Open { until: Instant::now() + self.wait() }
    }

    fn transition(&self, st: &mut State, to: Phase) {
        let from = phase_state(&st.phase);
        st.phase = to;
        st.epoch += 1;
        let to = phase_state(&st.phase);
        let downstream = self.downstream;
        tracing::warn!(downstream, from = from.label(), to = to.label(), "circuit breaker state changed");
        metrics::counter!(
            "resilience_breaker_transitions_total",
            "downstream" => downstream, "from" => from.label(), "to" => to.label()
        )
        .increment(1);
        metrics::gauge!("resilience_breaker_state", "downstream" => downstream).set(to.gauge());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent on every path, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn phase_state(phase: &Phase) -> CircuitState {
    match phase {
        Phase::Closed { .. } => CircuitState::Closed,
        Phase::Open { .. } => CircuitState::Open,
        Phase::HalfOpen { .. } => CircuitState::HalfOpen,
    }
}

impl Permit {
    /// Records the attempt as failed or not; slowness is measured since admission.
    pub(crate) fn record(mut self, failure: bool) {
        self.recorded = true;
        let slow =
            self.started.elapsed() >= Duration::from_millis(self.breaker.settings.slow_call_duration_ms);
        self.breaker.record(self.epoch, Record { failure, slow });
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.probe && !self.recorded {
            self.breaker.release(self.epoch);
        }
    }
}

/// Puts a breaker in front of the attempts of one downstream.
#[derive(Debug, Clone)]
pub(crate) struct BreakerLayer {
    breaker: Arc<Breaker>,
}

impl BreakerLayer {
    pub(crate) fn new(breaker: Arc<Breaker>) -> Self {
        Self { breaker }
    }
}

impl<S> tower::Layer<S> for BreakerLayer {
    type Service = BreakerService<S>;
    fn layer(&self, inner: S) -> BreakerService<S> {
        BreakerService { inner, breaker: Arc::clone(&self.breaker) }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BreakerService<S> {
    inner: S,
    breaker: Arc<Breaker>,
}

impl<S, Req, B> tower::Service<Req> for BreakerService<S>
where
    S: tower::Service<Req, Response = http::Response<B>, Error = BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<http::Response<B>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let permit = match self.breaker.acquire() {
            Ok(permit) => permit,
            Err(retry_after) => {
                let err = reject(self.breaker.downstream, Rejection::CircuitOpen { retry_after });
                return Box::pin(std::future::ready(Err(err)));
            }
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            permit.record(Outcome::of(&result).is_failure());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Svc, TestFuture, grpc_response, path};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, ServiceExt};

    const UNAVAILABLE: i32 = 14;
    const FAILED_PRECONDITION: i32 = 9;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            sliding_window_size: 10,
            minimum_calls: 4,
            failure_rate_threshold: 50.0,
            slow_call_duration_ms: 1_000,
            slow_call_rate_threshold: 100.0,
            wait_duration_open_ms: 500,
            permitted_calls_half_open: 3,
        }
    }

    /// Answers with the code in `codes` at the call's index (last one repeats), after
    /// `delay`, counting calls.
    fn scripted(codes: Vec<i32>, delay: Duration, calls: Arc<AtomicUsize>) -> impl Svc<()> {
        let codes = Arc::new(codes);
        tower::service_fn(move |_req: http::Request<()>| -> TestFuture {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let code = codes[n.min(codes.len() - 1)];
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Ok(grpc_response(code))
            })
        })
    }

    fn fixture(
        settings: BreakerSettings,
        codes: Vec<i32>,
        delay: Duration,
    ) -> (Arc<Breaker>, Arc<AtomicUsize>, impl Svc<()>) {
        let breaker = Breaker::new("inventory", settings);
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = BreakerLayer::new(Arc::clone(&breaker)).layer(scripted(codes, delay, Arc::clone(&calls)));
        (breaker, calls, svc)
    }

    async fn run(svc: &impl Svc<()>, n: usize) -> Vec<Result<http::Response<()>, BoxError>> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(svc.clone().oneshot(path("GetStock")).await);
        }
        out
    }

    fn circuit_open(result: &Result<http::Response<()>, BoxError>) -> Option<Duration> {
        let status = result.as_ref().err()?.downcast_ref::<tonic::Status>()?;
        match crate::rejection(status)? {
            Rejection::CircuitOpen { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn opens_at_the_failure_rate_only_after_minimum_calls() {
        let (breaker, _, svc) = fixture(settings(), vec![UNAVAILABLE], Duration::ZERO);
        run(&svc, 3).await;
        assert_eq!(breaker.state(), CircuitState::Closed, "3 failures < minimum_calls 4");
        run(&svc, 1).await;
        assert_eq!(breaker.state(), CircuitState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn stays_closed_below_the_failure_rate() {
        // ok, fail, ok, ok, ok, fail, ok, ok: at most 33% failed at any point past 4 calls.
        let codes = vec![0, UNAVAILABLE, 0, 0, 0, UNAVAILABLE, 0, 0];
        let (breaker, _, svc) = fixture(settings(), codes, Duration::ZERO);
        run(&svc, 8).await;
        assert_eq!(breaker.state(), CircuitState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn open_rejects_without_calling_inner() {
        let (breaker, calls, svc) = fixture(settings(), vec![UNAVAILABLE], Duration::ZERO);
        run(&svc, 4).await;
        assert_eq!(breaker.state(), CircuitState::Open);
        tokio::time::advance(Duration::from_millis(200)).await;
        let results = run(&svc, 5).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4, "no call reached the inner service");
        let retry_after = circuit_open(&results[0]).expect("circuit_open rejection");
        assert_eq!(retry_after, Duration::from_millis(300));
        let status = results[0].as_ref().unwrap_err().downcast_ref::<tonic::Status>().unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_after_the_wait_then_closed_after_successful_probes() {
        // 4 failures open it; then the probes succeed.
        let (breaker, calls, svc) =
            fixture(settings(), vec![UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, 0], Duration::ZERO);
        run(&svc, 4).await;
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(circuit_open(&run(&svc, 1).await[0]).is_some(), "still open 1 ms before the wait ends");
        tokio::time::advance(Duration::from_millis(1)).await;
        run(&svc, 1).await;
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        run(&svc, 1).await;
        assert_eq!(breaker.state(), CircuitState::HalfOpen, "2 of 3 probes done");
        run(&svc, 1).await;
        assert_eq!(breaker.state(), CircuitState::Closed);
        assert_eq!(calls.load(Ordering::SeqCst), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_reopens_when_the_probes_fail() {
        let (breaker, _, svc) = fixture(settings(), vec![UNAVAILABLE], Duration::ZERO);
        run(&svc, 4).await;
        tokio::time::advance(Duration::from_millis(500)).await;
        run(&svc, 3).await;
        assert_eq!(breaker.state(), CircuitState::Open);
        assert!(circuit_open(&run(&svc, 1).await[0]).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_closes_when_probe_failure_rate_is_under_threshold() {
        // One failed probe of three is 33% < 50%: closes (rate decides, not a single failure).
        let codes = vec![UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, 0, 0];
        let (breaker, _, svc) = fixture(settings(), codes, Duration::ZERO);
        run(&svc, 4).await;
        tokio::time::advance(Duration::from_millis(500)).await;
        run(&svc, 3).await;
        assert_eq!(breaker.state(), CircuitState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_admits_only_the_permitted_probes() {
        let (breaker, calls, svc) = fixture(
            settings(),
            vec![UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, 0],
            Duration::from_millis(100),
        );
        run(&svc, 4).await;
        tokio::time::advance(Duration::from_millis(500)).await;
        let probes: Vec<_> = (0..3).map(|_| tokio::spawn(svc.clone().oneshot(path("GetStock")))).collect();
        tokio::task::yield_now().await;
        assert!(circuit_open(&run(&svc, 1).await[0]).is_some(), "a 4th concurrent probe is rejected");
        for p in probes {
            assert!(p.await.unwrap().is_ok());
        }
        assert_eq!(breaker.state(), CircuitState::Closed);
        assert_eq!(calls.load(Ordering::SeqCst), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_gives_its_slot_back() {
        let (breaker, _, svc) = fixture(
            settings(),
            vec![UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, 0],
            Duration::from_millis(100),
        );
        run(&svc, 4).await;
        tokio::time::advance(Duration::from_millis(500)).await;
        for _ in 0..3 {
            let fut = svc.clone().oneshot(path("GetStock"));
            assert!(tokio::time::timeout(Duration::from_millis(10), fut).await.is_err(), "cancelled");
        }
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        run(&svc, 3).await;
        assert_eq!(breaker.state(), CircuitState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_calls_open_it_when_the_slow_rate_is_reached() {
        let s = BreakerSettings { slow_call_rate_threshold: 50.0, ..settings() };
        let (breaker, _, svc) = fixture(s, vec![0], Duration::from_millis(1_000));
        run(&svc, 4).await;
        assert_eq!(breaker.state(), CircuitState::Open, "4 successful but slow calls");
        let (breaker, _, svc) = fixture(
            BreakerSettings { slow_call_rate_threshold: 50.0, ..settings() },
            vec![0],
            Duration::from_millis(999),
        );
        run(&svc, 4).await;
        assert_eq!(breaker.state(), CircuitState::Closed, "just under the slow threshold");
    }

    #[tokio::test(start_paused = true)]
    async fn business_errors_do_not_trip_it() {
        let (breaker, calls, svc) = fixture(settings(), vec![FAILED_PRECONDITION, 3, 5, 10], Duration::ZERO);
        run(&svc, 20).await;
        assert_eq!(breaker.state(), CircuitState::Closed);
        assert_eq!(calls.load(Ordering::SeqCst), 20);
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_counts_only_the_last_calls() {
        // 10 successes fill the window; each failure pushes a success out.
        let mut codes = vec![0; 10];
        codes.extend([UNAVAILABLE; 5]);
        let (breaker, _, svc) = fixture(settings(), codes, Duration::ZERO);
        run(&svc, 14).await;
        assert_eq!(breaker.state(), CircuitState::Closed, "4 of the last 10 failed");
        run(&svc, 1).await;
        assert_eq!(breaker.state(), CircuitState::Open, "5 of the last 10 failed");
    }

    #[test]
    fn the_state_gauge_and_the_transition_counters_follow_the_breaker() {
        // A local recorder: only this test's series, whatever else runs in the process.
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let prometheus = recorder.handle();
        let expect = |series: &[(&str, &str, u32)], state: u32| {
            let text = prometheus.render();
            let d = "downstream=\"gauge-test\"";
            let gauge = format!("resilience_breaker_state{{{d}}} {state}");
            assert!(text.contains(&gauge), "missing {gauge} in\n{text}");
            for (from, to, n) in series {
                let counter =
                    format!("resilience_breaker_transitions_total{{{d},from=\"{from}\",to=\"{to}\"}} {n}");
                assert!(text.contains(&counter), "missing {counter} in\n{text}");
            }
        };
        metrics::with_local_recorder(&recorder, || {
            // One call decides; no wait in open, so the next attempt is a probe.
            let s = BreakerSettings {
                sliding_window_size: 1,
                minimum_calls: 1,
                wait_duration_open_ms: 0,
                permitted_calls_half_open: 1,
                ..settings()
            };
            register_metrics("gauge-test");
            let breaker = Breaker::new("gauge-test", s);
            let all = |n: [u32; 4]| {
                [
                    ("closed", "open", n[0]),
                    ("open", "half_open", n[1]),
                    ("half_open", "closed", n[2]),
                    ("half_open", "open", n[3]),
                ]
            };
            expect(&all([0, 0, 0, 0]), 0);
            breaker.acquire().unwrap().record(true);
            assert_eq!(breaker.state(), CircuitState::Open);
            expect(&all([1, 0, 0, 0]), 1);
            let probe = breaker.acquire().unwrap();
            assert_eq!(breaker.state(), CircuitState::HalfOpen);
            expect(&all([1, 1, 0, 0]), 2);
            probe.record(false);
            assert_eq!(breaker.state(), CircuitState::Closed);
            expect(&all([1, 1, 1, 0]), 0);
            breaker.acquire().unwrap().record(true);
            breaker.acquire().unwrap().record(true);
            assert_eq!(breaker.state(), CircuitState::Open);
            expect(&all([2, 2, 1, 1]), 1);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn the_slow_call_rate_is_the_share_of_slow_calls_in_the_window() {
        let breaker =
            Breaker::new("inventory", BreakerSettings { slow_call_rate_threshold: 50.0, ..settings() });
        let call = |slow: bool| {
            let permit = breaker.acquire().unwrap();
            async move {
                if slow {
                    tokio::time::advance(Duration::from_millis(1_000)).await;
                }
                permit.record(false);
            }
        };
        for slow in [false, false, false, true, true] {
            call(slow).await;
        }
        assert_eq!(breaker.state(), CircuitState::Closed, "1 of 4, then 2 of 5 slow: under 50%");
        call(true).await;
        assert_eq!(breaker.state(), CircuitState::Open, "3 of 6 slow");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_result_of_an_older_state_is_not_recorded() {
        let breaker = Breaker::new("inventory", settings());
        // Admitted while closed, finished only once the breaker is half-open.
        let late: Vec<_> = (0..2).map(|_| breaker.acquire().unwrap()).collect();
        for _ in 0..4 {
            breaker.acquire().unwrap().record(true);
        }
        tokio::time::advance(Duration::from_millis(500)).await;
        let probe = breaker.acquire().unwrap();
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        for permit in late {
            permit.record(true);
        }
        probe.record(false);
        assert_eq!(
            breaker.state(),
            CircuitState::HalfOpen,
            "one probe of three done; the late failures do not count"
        );
        breaker.acquire().unwrap().record(false);
        breaker.acquire().unwrap().record(false);
        assert_eq!(breaker.state(), CircuitState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_probe_does_not_give_its_slot_back() {
        let breaker = Breaker::new("inventory", settings());
        for _ in 0..4 {
            breaker.acquire().unwrap().record(true);
        }
        tokio::time::advance(Duration::from_millis(500)).await;
        let mut probes: Vec<_> = (0..3).map(|_| breaker.acquire().unwrap()).collect();
        probes.pop().unwrap().record(false);
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        assert!(breaker.acquire().is_err(), "3 probes admitted, 2 still running: no 4th");
        for probe in probes {
            probe.record(false);
        }
        assert_eq!(breaker.state(), CircuitState::Closed);
    }
}
