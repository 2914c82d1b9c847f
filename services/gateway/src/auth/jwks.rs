//! [`RemoteJwks`]: the identity provider's keys (`auth.jwks_url`), cached.
//!
//! * **Fetched outside any lock, one fetch at a time.** The cache's state sits behind a
//!   mutex held only to read or update it; the HTTP fetch runs without it. While a fetch
//!   runs, requests whose key is cached go on with it; only those that need the fetch's
//!   result (no keys yet, or a `kid` the cache lacks) wait for it, and for that fetch
//!   only, never for one started after theirs.
//! * **Refreshed in the background.** Keys older than `jwks_refresh_secs` are still
//!   used, while a task fetches new ones.
//! * **Stale keys during an outage.** A failed fetch keeps the keys there are, and the
//!   next attempt waits 1 s, then 2 s, 4 s ... up to [`MAX_BACKOFF`] after failures in a
//!   row, so an identity provider that is down is not hammered by every request.
//! * **Unknown `kid`** (key rotation): fetched again at most every
//!   `jwks_unknown_kid_refetch_ms`, so tokens with invented `kid`s cannot flood the
//!   provider.

use jsonwebtoken::jwk::JwkSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The longest wait between attempts after failures in a row.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Why no key could be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// Never fetched successfully: the last error, or that an attempt waits for its backoff.
    NoKeys(String),
}

#[derive(Default)]
struct State {
    keys: Option<Arc<JwkSet>>,
    fetched_at: Option<Instant>,
    attempted_at: Option<Instant>,
    /// Failed attempts in a row.
    failures: u32,
    fetching: bool,
    last_error: Option<String>,
}

impl State {
    /// How long after the last attempt the next may start.
    fn backoff(&self) -> Duration {
        match self.failures {
            0 => Duration::ZERO,
            n => Duration::from_secs(1u64 << (n - 1).min(6)).min(MAX_BACKOFF),
        }
    }

    fn may_attempt(&self, now: Instant, at_least: Duration) -> bool {
        !self.fetching
            && self.attempted_at.is_none_or(|t| now.duration_since(t) >= self.backoff().max(at_least))
    }
}

struct Inner {
    url: String,
    client: reqwest::Client,
    state: Mutex<State>,
    /// Bumped when a fetch ends (whatever its result).
    done: watch::Sender<u64>,
}

/// The keys of `auth.jwks_url` (see the module docs).
#[derive(Clone)]
pub struct RemoteJwks {
    inner: Arc<Inner>,
    refresh: Duration,
    refetch: Duration,
}

/// What a lookup does next, decided under the state's lock.
enum Next {
    Keys(Arc<JwkSet>),
    Fetch,
    Wait(watch::Receiver<u64>),
    Fail(Unavailable),
}

impl RemoteJwks {
    /// `refresh`: keys older than this are refreshed in the background; `refetch`: a
    /// lookup for a `kid` the keys lack fetches again at most this often.
    pub fn new(url: String, client: reqwest::Client, refresh: Duration, refetch: Duration) -> Self {
        let (done, _) = watch::channel(0);
        Self { inner: Arc::new(Inner { url, client, state: Mutex::default(), done }), refresh, refetch }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The keys to look `kid` up in: `has(keys)` says whether they hold it. Keys that
    /// lack it are fetched again (at most every `refetch`); when they cannot be, the
    /// keys there are come back and `has` decides.
    pub async fn keys(&self, has: impl Fn(&JwkSet) -> bool) -> Result<Arc<JwkSet>, Unavailable> {
        // At most: decide, wait for or run one fetch, decide again.
        for round in 0..2 {
            let next = {
                let mut state = self.lock();
                let now = Instant::now();
                match state.keys.clone() {
                    Some(keys) if has(&keys) => {
                        let stale = state.fetched_at.is_none_or(|t| now.duration_since(t) >= self.refresh);
                        if stale && state.may_attempt(now, Duration::ZERO) {
                            state.fetching = true;
                            state.attempted_at = Some(now);
                            tokio::spawn(self.clone().fetch());
                        }
                        Next::Keys(keys)
                    }
                    _ if state.fetching && round == 0 => Next::Wait(self.inner.done.subscribe()),
                    keys => {
                        let at_least = if keys.is_some() { self.refetch } else { Duration::ZERO };
                        if round == 0 && state.may_attempt(now, at_least) {
                            state.fetching = true;
                            state.attempted_at = Some(now);
                            Next::Fetch
                        } else {
                            match keys {
                                Some(keys) => Next::Keys(keys),
                                None => Next::Fail(Unavailable::NoKeys(
                                    state.last_error.clone().unwrap_or_else(|| "not fetched yet".into()),
                                )),
                            }
                        }
                    }
                }
            };
            match next {
                Next::Keys(keys) => return Ok(keys),
                Next::Fail(why) => return Err(why),
                Next::Fetch => self.clone().fetch().await,
                Next::Wait(mut done) => {
                    // The fetch ends with a send; a closed channel cannot happen (we hold the sender).
                    let _ = done.changed().await;
                }
            }
        }
        let state = self.lock();
        state.keys.clone().ok_or_else(|| {
            Unavailable::NoKeys(state.last_error.clone().unwrap_or_else(|| "not fetched yet".into()))
        })
    }

    /// One fetch (the caller set `fetching`): updates the state, wakes the waiters.
    async fn fetch(self) {
        let result = fetch(&self.inner.client, &self.inner.url).await;
        {
            let mut state = self.lock();
            state.fetching = false;
            match result {
                Ok(keys) => {
                    state.keys = Some(Arc::new(keys));
                    state.fetched_at = Some(Instant::now());
                    state.failures = 0;
                    state.last_error = None;
                }
                Err(e) => {
                    state.failures = state.failures.saturating_add(1);
                    tracing::warn!(url = %self.inner.url, error = %e, failures = state.failures,
                        serving_stale_keys = state.keys.is_some(), "JWKS fetch failed");
                    state.last_error = Some(format!("{}: {e}", self.inner.url));
                }
            }
        }
        self.inner.done.send_modify(|generation| *generation += 1);
    }
}

async fn fetch(client: &reqwest::Client, url: &str) -> Result<JwkSet, reqwest::Error> {
    client.get(url).send().await?.error_for_status()?.json().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_one_second_up_to_a_minute() {
        let after = |failures| State { failures, ..Default::default() }.backoff();
        assert_eq!(after(0), Duration::ZERO);
        assert_eq!(after(1), Duration::from_secs(1));
        assert_eq!(after(3), Duration::from_secs(4));
        assert_eq!(after(7), MAX_BACKOFF);
        assert_eq!(after(40), MAX_BACKOFF);
    }
}
