//! Says when a task blocks a runtime worker thread.
//!
//! A task that runs blocking code (a synchronous client call, a destructor
//! that waits, a long computation) holds its worker thread. A service runs on
//! as many workers as it has cores; with two, two such tasks silence it while
//! its ports stay open: requests time out, background loops stop, and nothing
//! is logged, because the code that would log is what stopped.
//!
//! So the check runs outside the runtime: a heartbeat task on the runtime
//! bumps a counter every `TICK`, and a thread of its own watches the
//! counter. When the heartbeat is late by more than `THRESHOLD`, the thread
//! logs an error (again every `REPEAT` while it lasts) and counts
//! `runtime_stalls_total`; when the heartbeat is back it logs how long the
//! runtime was stalled. `/health/live` does not answer during a stall either,
//! which is what gets the process restarted; the log says why it was.
//!
//! ```ignore
//! let shutdown = sagaworks_runtime::shutdown::on_signal();
//! sagaworks_runtime::watchdog::spawn()?;
//! ```
//!
//! Both the task and the thread end when the runtime shuts down. Where a
//! stall shows up, `gdb -p <pid> -batch -ex 'thread apply all bt'` names the
//! call on the blocked worker (`scripts/chaos` does this when a check fails).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counter: runtime stalls longer than [`THRESHOLD`] since the process started.
pub(crate) const RUNTIME_STALLS_TOTAL: &str = "runtime_stalls_total";

/// How often the heartbeat beats and the watching thread looks.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// A heartbeat this late is a stall. Far above any scheduling delay of a
/// busy machine, far below the timeouts of the services' callers.
pub(crate) const THRESHOLD: Duration = Duration::from_secs(1);
/// While a stall lasts, it is logged again this often.
pub(crate) const REPEAT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Heartbeat {
    beats: AtomicU64,
    /// Set when the heartbeat task is gone: the runtime shut down.
    stopped: AtomicBool,
}

/// Sets `stopped` when the heartbeat task is dropped, however that happens.
struct StopOnDrop(Arc<Heartbeat>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::SeqCst);
    }
}

/// Starts watching the current runtime with the default `THRESHOLD`.
/// Must be called inside a Tokio runtime; fails only if no thread can be started.
pub fn spawn() -> std::io::Result<()> {
    // Registered at 0 on the recorder that /metrics renders.
    crate::metrics::handle();
    metrics::counter!(RUNTIME_STALLS_TOTAL).absolute(0);
    spawn_with(THRESHOLD, |stall| match stall {
        Stall::Started { late } => {
            metrics::counter!(RUNTIME_STALLS_TOTAL).increment(1);
            tracing::error!(?late, "the runtime is stalled: a task is blocking a worker thread");
        }
        Stall::Lasting { late } => {
            tracing::error!(?late, "the runtime is still stalled: a task is blocking a worker thread");
        }
        Stall::Ended { lasted } => tracing::warn!(?lasted, "the runtime is running again after a stall"),
    })
}

/// What the watching thread reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stall {
    /// The heartbeat is `late` by more than the threshold.
    Started { late: Duration },
    /// Still stalled, every [`REPEAT`].
    Lasting { late: Duration },
    /// The heartbeat is back after `lasted`.
    Ended { lasted: Duration },
}

/// [`spawn`] with another threshold and another reaction (tests).
pub(crate) fn spawn_with(
    threshold: Duration,
    mut report: impl FnMut(Stall) + Send + 'static,
) -> std::io::Result<()> {
    let heartbeat = Arc::new(Heartbeat::default());
    let watched = Arc::clone(&heartbeat);
    std::thread::Builder::new().name("runtime-watchdog".into()).spawn(move || {
        let mut seen = watched.beats.load(Ordering::SeqCst);
        let mut last_beat = Instant::now();
        let mut stalled: Option<Instant> = None;
        while !watched.stopped.load(Ordering::SeqCst) {
            std::thread::sleep(TICK);
            let beats = watched.beats.load(Ordering::SeqCst);
            if beats != seen {
                seen = beats;
                let now = Instant::now();
                // The gap since the last beat seen before this one: the stall.
                let gap = now - last_beat;
                last_beat = now;
                if stalled.take().is_some() {
                    report(Stall::Ended { lasted: gap });
                }
                continue;
            }
            let late = last_beat.elapsed();
            match stalled {
                None if late > threshold => {
                    stalled = Some(Instant::now());
                    report(Stall::Started { late });
                }
                Some(reported) if reported.elapsed() >= REPEAT => {
                    stalled = Some(Instant::now());
                    report(Stall::Lasting { late });
                }
                _ => {}
            }
        }
    })?;
    tokio::spawn(async move {
        let _stop = StopOnDrop(Arc::clone(&heartbeat));
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            heartbeat.beats.fetch_add(1, Ordering::SeqCst);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A runtime with one worker, watched with a 500 ms threshold; the
    /// reports arrive on the receiver.
    fn watched_runtime() -> (tokio::runtime::Runtime, mpsc::Receiver<Stall>) {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, rx) = mpsc::channel();
        runtime.block_on(async {
            spawn_with(Duration::from_millis(500), move |stall| {
                let _ = tx.send(stall);
            })
            .unwrap();
        });
        (runtime, rx)
    }

    /// A task blocks the only worker until the watchdog has reported the
    /// stall, so the report came while the stall lasted; then it lets go, and
    /// the end is reported too.
    #[test]
    fn a_blocked_worker_is_reported_while_it_lasts_and_when_it_ends() {
        let (runtime, rx) = watched_runtime();
        runtime.block_on(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            // The 30 s only turn a watchdog that never reports into a failure
            // instead of a hang.
            let blocked = tokio::spawn(async move { (rx.recv_timeout(Duration::from_secs(30)), rx) });
            let (first, rx) = blocked.await.unwrap();
            let first = first.expect("a report while the worker is blocked");
            let Stall::Started { late } = first else { panic!("expected the start of a stall: {first:?}") };
            assert!(late > Duration::from_millis(500), "{first:?}");
            let second = rx.recv_timeout(Duration::from_secs(30)).expect("the end of the stall");
            assert!(
                matches!(second, Stall::Ended { lasted } if lasted >= late),
                "the end reports how long the block stalled the runtime: {second:?}"
            );
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
    }

    /// A runtime that only waits is not stalled, and the watching thread
    /// ends with the runtime.
    #[test]
    fn an_idle_runtime_is_never_reported_and_the_thread_ends_with_it() {
        let (runtime, rx) = watched_runtime();
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(1500)).await });
        drop(runtime);
        // The sender lives in the thread: disconnected = the thread ended.
        match rx.recv_timeout(Duration::from_secs(2)) {
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
            other => panic!("expected no report and the thread gone, got {other:?}"),
        }
    }
}
