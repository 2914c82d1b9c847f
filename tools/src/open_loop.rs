//! Open-loop load: orders arrive at a fixed rate, each sent at its intended
//! time whatever the answers before it did, the way independent users
//! arrive. A request's latency is measured from its *intended* send time, so
//! a stall shows in every request it held up, not only in the one that was
//! in flight (a closed loop stops sending while it waits, and its
//! percentiles hide the queueing: "coordinated omission"). Latencies go into
//! an HdrHistogram (microseconds, 3 significant digits).
//!
//! [`run`] drives one rate for one duration; [`sweep`] raises the rate step
//! by step and stops at the first step that misses its bound, which gives
//! the knee: the highest rate whose p99 stays under the bound while the
//! system keeps up.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What one request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sample {
    /// Accepted; `status` is the order's status in the answer.
    Accepted { order_id: String, status: String },
    /// Answered with another HTTP status.
    Rejected(u16),
    /// No answer (refused, reset, timed out), by kind.
    Failed(String),
}

impl Sample {
    /// A finished saga: accepted and `CONFIRMED` or `CANCELLED`.
    pub fn completed(&self) -> bool {
        matches!(self, Self::Accepted { status, .. } if status == "CONFIRMED" || status == "CANCELLED")
    }
}

#[derive(Debug, Clone)]
pub struct OpenPlan {
    /// Arrivals per second.
    pub rate: f64,
    pub duration: Duration,
    /// At most this many requests in flight: beyond it a request waits for a
    /// slot (and its wait counts in its latency), so a stalled system cannot
    /// make the generator open unbounded connections.
    pub max_in_flight: usize,
}

/// One rate's outcome.
#[derive(Debug)]
pub struct StepReport {
    pub rate: f64,
    /// Requests sent (rate x duration).
    pub sent: u64,
    /// From the first intended send to the last answer.
    pub elapsed: Duration,
    /// Accepted orders and their status in the answer.
    pub accepted: Vec<(String, String)>,
    pub rejected: BTreeMap<u16, u64>,
    pub failed: BTreeMap<String, u64>,
    /// Completed sagas' latency from the intended send time, in microseconds.
    pub latency: Histogram<u64>,
    /// Requests that waited for an in-flight slot.
    pub waited_for_slot: u64,
}

impl StepReport {
    fn new(rate: f64) -> Self {
        Self {
            rate,
            sent: 0,
            elapsed: Duration::ZERO,
            accepted: Vec::new(),
            rejected: BTreeMap::new(),
            failed: BTreeMap::new(),
            // 1 µs .. 1 h, 3 significant digits: bounds that always fit.
            latency: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static bounds are valid"),
            waited_for_slot: 0,
        }
    }

    pub fn completed(&self) -> u64 {
        self.latency.len()
    }

    /// Completed sagas per second over the step.
    pub fn throughput(&self) -> f64 {
        self.completed() as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    /// The latency at quantile `q` (0..=1); `None` without completed sagas.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        (!self.latency.is_empty()).then(|| Duration::from_micros(self.latency.value_at_quantile(q)))
    }

    /// Requests answered without a finished saga: rejected, failed, or
    /// accepted and answered while the saga still ran (the gateway's wait ran
    /// out); such a saga may well finish after the answer.
    pub fn without_saga(&self) -> u64 {
        self.sent - self.completed()
    }

    fn record(&mut self, intended: Instant, answered: Instant, sample: Sample) {
        if sample.completed() {
            let micros = u64::try_from((answered - intended).as_micros()).unwrap_or(u64::MAX);
            self.latency.saturating_record(micros.max(1));
        }
        match sample {
            Sample::Accepted { order_id, status } => self.accepted.push((order_id, status)),
            Sample::Rejected(status) => *self.rejected.entry(status).or_default() += 1,
            Sample::Failed(kind) => *self.failed.entry(kind).or_default() += 1,
        }
    }
}

/// Sends `plan.rate` requests a second for `plan.duration` (each made by
/// `send`), or until `stop` is cancelled, then waits for the last answers.
pub async fn run<F, Fut>(plan: &OpenPlan, send: F, stop: &CancellationToken) -> StepReport
where
    F: Fn() -> Fut,
    Fut: Future<Output = Sample> + Send + 'static,
{
    let mut report = StepReport::new(plan.rate);
    let total = (plan.rate * plan.duration.as_secs_f64()).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / plan.rate.max(f64::MIN_POSITIVE));
    let slots = Arc::new(tokio::sync::Semaphore::new(plan.max_in_flight.max(1)));
    let mut in_flight = JoinSet::new();
    let start = Instant::now();
    for i in 0..total {
        let intended = start + interval.mul_f64(i as f64);
        tokio::select! {
            () = tokio::time::sleep_until(intended) => {}
            () = stop.cancelled() => break,
        }
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                report.waited_for_slot += 1;
                Arc::clone(&slots).acquire_owned().await.expect("the semaphore is never closed")
            }
        };
        let request = send();
        in_flight.spawn(async move {
            let sample = request.await;
            drop(slot);
            (intended, Instant::now(), sample)
        });
        report.sent += 1;
        while let Some(done) = in_flight.try_join_next() {
            let (intended, answered, sample) = done.expect("a request task does not panic");
            report.record(intended, answered, sample);
        }
    }
    while let Some(done) = in_flight.join_next().await {
        let (intended, answered, sample) = done.expect("a request task does not panic");
        report.record(intended, answered, sample);
    }
    report.elapsed = start.elapsed();
    report
}

/// When a step counts as kept up with.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// p99 of completed sagas at most this.
    pub p99: Duration,
    /// At most this share of the requests without a completed saga.
    pub max_error_share: f64,
}

impl Bound {
    /// Why `step` misses the bound; `None` if it meets it.
    pub fn missed_by(&self, step: &StepReport) -> Option<String> {
        let without_saga = step.without_saga() as f64 / step.sent.max(1) as f64;
        match step.quantile(0.99) {
            None => Some("no saga completed".into()),
            Some(p99) if p99 > self.p99 => Some(format!("p99 {p99:?} over {:?}", self.p99)),
            Some(_) if without_saga > self.max_error_share => Some(format!(
                "{:.1} % of the requests were answered without a finished saga",
                100.0 * without_saga
            )),
            Some(_) => None,
        }
    }
}

/// The rates a sweep tries: `from`, `from + step`, ... up to `to`.
pub fn rates(from: f64, to: f64, step: f64) -> Vec<f64> {
    let mut rates = Vec::new();
    let mut r = from;
    while r <= to + 1e-9 && step > 0.0 {
        rates.push(r);
        r += step;
    }
    rates
}

/// Runs each rate of `rates` in turn (calling `each` with every step's
/// report) until one misses `bound` or `stop` is cancelled; returns all the
/// steps and the knee (the last rate that met it).
pub async fn sweep<F, Fut>(
    rates: &[f64],
    plan: &OpenPlan,
    bound: Bound,
    send: F,
    stop: &CancellationToken,
    mut each: impl FnMut(&StepReport, Option<&str>),
) -> (Vec<StepReport>, Option<f64>)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Sample> + Send + 'static,
{
    let mut steps = Vec::new();
    let mut knee = None;
    for &rate in rates {
        let step = run(&OpenPlan { rate, ..plan.clone() }, &send, stop).await;
        let missed = bound.missed_by(&step);
        each(&step, missed.as_deref());
        steps.push(step);
        if missed.is_some() || stop.is_cancelled() {
            break;
        }
        knee = Some(rate);
    }
    (steps, knee)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// `actual` is `expected` to the histogram's precision (3 significant digits).
    #[track_caller]
    fn assert_near(actual: Option<Duration>, expected: Duration) {
        let actual = actual.expect("a latency");
        let off = actual.abs_diff(expected);
        assert!(off <= expected / 1_000, "{actual:?} is not {expected:?} to 3 significant digits");
    }

    fn confirmed() -> Sample {
        Sample::Accepted { order_id: "o".into(), status: "CONFIRMED".into() }
    }

    /// A downstream on Tokio's clock: answers after `service` time, except
    /// that nothing is answered before `stall_until` (a pause of the system
    /// under test, e.g. a stop-the-world or a lock).
    #[derive(Clone)]
    struct Downstream {
        service: Duration,
        stall: Option<(Instant, Instant)>,
        calls: Arc<Mutex<u64>>,
    }

    impl Downstream {
        fn send(&self) -> impl Future<Output = Sample> + Send + 'static {
            let this = self.clone();
            async move {
                *this.calls.lock().unwrap() += 1;
                tokio::time::sleep(this.service).await;
                if let Some((from, until)) = this.stall
                    && Instant::now() >= from
                    && Instant::now() < until
                {
                    tokio::time::sleep_until(until).await;
                }
                confirmed()
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sends_at_the_rate_whatever_the_answers_and_measures_from_the_intended_time() {
        let downstream =
            Downstream { service: Duration::from_millis(10), stall: None, calls: Default::default() };
        let plan = OpenPlan { rate: 100.0, duration: Duration::from_secs(10), max_in_flight: 10_000 };
        let report = run(&plan, || downstream.send(), &CancellationToken::new()).await;
        assert_eq!(report.sent, 1_000);
        assert_eq!(*downstream.calls.lock().unwrap(), 1_000);
        assert_eq!(report.completed(), 1_000);
        assert_near(report.quantile(0.5), Duration::from_millis(10));
        assert_near(report.quantile(1.0), Duration::from_millis(10));
        // The last request is intended at 9.99 s and answered 10 ms later.
        assert_eq!(report.elapsed, Duration::from_secs(10));
        assert_eq!(report.waited_for_slot, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_sending_and_waits_for_the_answers_in_flight() {
        let downstream =
            Downstream { service: Duration::from_millis(500), stall: None, calls: Default::default() };
        let plan = OpenPlan { rate: 100.0, duration: Duration::from_secs(10), max_in_flight: 10_000 };
        let stop = CancellationToken::new();
        let start = Instant::now();
        tokio::spawn({
            let stop = stop.clone();
            async move {
                tokio::time::sleep_until(start + Duration::from_millis(2_995)).await;
                stop.cancel();
            }
        });
        let report = run(&plan, || downstream.send(), &stop).await;
        // Sent at 0, 10 ms, ..., 2.99 s; each of them answered.
        assert_eq!(report.sent, 300);
        assert_eq!(report.completed(), 300);
        assert_eq!(report.elapsed, Duration::from_millis(3_490));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_counts_in_every_request_it_held_up_not_only_the_one_in_flight() {
        // At 100/s, the system stops answering for 1 s at t = 5 s. A closed loop with one
        // worker would record one slow request; here the ~100 requests that arrived
        // during the stall all wait for its end.
        let start = Instant::now();
        let stall = (start + Duration::from_secs(5), start + Duration::from_secs(6));
        let downstream =
            Downstream { service: Duration::from_millis(10), stall: Some(stall), calls: Default::default() };
        let plan = OpenPlan { rate: 100.0, duration: Duration::from_secs(10), max_in_flight: 10_000 };
        let report = run(&plan, || downstream.send(), &CancellationToken::new()).await;
        assert_eq!(report.completed(), 1_000);
        // Held up: those whose answer fell in [5 s, 6 s), i.e. intended in [4.99 s, 5.99 s).
        let held = report.latency.count_between(11_000, 2_000_000);
        assert_eq!(held, 100, "every request of the stall is slow");
        // The one intended at 4.99 s waited the whole second.
        assert_near(report.quantile(1.0), Duration::from_millis(1_010));
        // p99 sits inside the stall: 10 % of the requests were held up.
        assert!(report.quantile(0.99).unwrap() >= Duration::from_millis(900), "{:?}", report.quantile(0.99));
        assert!(report.quantile(0.5).unwrap() <= Duration::from_millis(11));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_set_of_in_flight_slots_delays_sends_and_the_delay_counts() {
        // Two slots, 100 ms per answer, 100 arrivals/s: only 20/s get through, and the
        // wait for a slot is part of each latency.
        let downstream =
            Downstream { service: Duration::from_millis(100), stall: None, calls: Default::default() };
        let plan = OpenPlan { rate: 100.0, duration: Duration::from_secs(1), max_in_flight: 2 };
        let report = run(&plan, || downstream.send(), &CancellationToken::new()).await;
        assert_eq!(report.sent, 100);
        assert_eq!(report.completed(), 100);
        // All but the first two found both slots taken.
        assert_eq!(report.waited_for_slot, 98);
        // Two at a time, 100 ms each: the last (intended at 0.99 s) starts at 4.91 s.
        assert_eq!(report.elapsed, Duration::from_millis(5_010));
        assert_near(report.quantile(1.0), Duration::from_millis(4_020));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_stops_at_the_first_rate_over_the_bound_and_reports_the_knee() {
        // A system with capacity for 10 requests in flight at 100 ms each: 100/s.
        // Beyond that the queue grows and p99 with it.
        let downstream =
            Downstream { service: Duration::from_millis(100), stall: None, calls: Default::default() };
        let plan = OpenPlan { rate: 0.0, duration: Duration::from_secs(5), max_in_flight: 10 };
        let bound = Bound { p99: Duration::from_millis(250), max_error_share: 0.01 };
        let mut seen = Vec::new();
        let (steps, knee) = sweep(
            &rates(40.0, 200.0, 40.0),
            &plan,
            bound,
            || downstream.send(),
            &CancellationToken::new(),
            |s, missed| seen.push((s.rate, missed.map(str::to_owned))),
        )
        .await;
        assert_eq!(knee, Some(80.0), "{seen:?}");
        assert_eq!(steps.len(), 3, "stops at 120/s: {seen:?}");
        assert!(seen[2].1.as_deref().unwrap().starts_with("p99"), "{seen:?}");
        assert!(steps[1].throughput() > 75.0, "80/s kept up with: {}", steps[1].throughput());
    }

    #[test]
    fn a_step_that_completes_too_few_sagas_misses_the_bound() {
        let mut step = StepReport::new(10.0);
        let now = Instant::now();
        for _ in 0..97 {
            step.record(now, now + Duration::from_millis(5), confirmed());
        }
        step.record(now, now, Sample::Rejected(503));
        step.record(now, now, Sample::Failed("timeout".into()));
        step.record(now, now, Sample::Accepted { order_id: "p".into(), status: "PENDING".into() });
        step.sent = 100;
        let bound = Bound { p99: Duration::from_millis(10), max_error_share: 0.02 };
        assert_eq!(step.without_saga(), 3);
        assert!(bound.missed_by(&step).unwrap().contains("3.0 %"), "{:?}", bound.missed_by(&step));
        assert_eq!(Bound { max_error_share: 0.05, ..bound }.missed_by(&step), None);
        assert!(
            Bound { p99: Duration::from_millis(4), ..bound }.missed_by(&step).unwrap().starts_with("p99")
        );
        assert_eq!(rates(100.0, 300.0, 100.0), vec![100.0, 200.0, 300.0]);
        assert!(rates(1.0, 2.0, 0.0).is_empty());
    }
}
