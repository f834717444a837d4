//! Persisting the highest observed version: retried until the store takes it, and never silently failing.
//!
//! # Policy while the store cannot persist
//! A version store that fails (a full disk, a database down) does not stop a client: the consumer keeps reading
//! within its assignment lease and the producer keeps publishing within its routing lease, because the version
//! is still held in memory and carried by every heartbeat and routing request of this process. What is at risk
//! is only the next *restart*: a process that crashes before the write succeeds reloads an older value and
//! cannot report a rollback that happened while it was down. So the [`VersionPersister`]
//! * retries the write of the highest version seen so far until it succeeds, with a growing backoff (it does not
//!   wait for the version to grow again);
//! * logs every failed attempt at `warn` and the recovery at `info`;
//! * reports every failure and every success to a [`PersistObserver`], through which each SDK exports a failure
//!   counter and a gauge that is 1 while the highest observed version is not persisted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::version_store::{SharedVersionStore, VersionStoreError};

/// How the persister retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PersistPolicy {
    /// Deadline of one write (a store that hangs counts as failed).
    pub attempt_timeout: Duration,
    /// Wait after the first failure.
    pub retry_min: Duration,
    /// Upper bound of the doubling wait.
    pub retry_max: Duration,
}

impl Default for PersistPolicy {
    fn default() -> Self {
        PersistPolicy {
            attempt_timeout: Duration::from_secs(2),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(5),
        }
    }
}

impl PersistPolicy {
    /// The same policy with other retry bounds (`min` is raised to at least 1 ms, `max` to at least `min`).
    pub fn with_retry(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min = min.max(Duration::from_millis(1));
        self.retry_max = max.max(self.retry_min);
        self
    }

    /// The same policy with another per-write deadline (at least 1 ms).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.retry_min.saturating_mul(1 << doublings).min(self.retry_max)
    }
}

/// Told about every write attempt, so the SDK can export it (see the module docs).
pub trait PersistObserver: Send + Sync + 'static {
    /// Writing `version` failed (an error, or the attempt timed out); it is retried after a backoff.
    fn failed(&self, version: u64, error: &VersionStoreError);
    /// `version` is persisted: nothing observed so far is waiting.
    fn persisted(&self, version: u64);
}

#[derive(Debug)]
struct Counters {
    /// The highest version known to be in the store; a watch so [`VersionPersister::flush`] can wait for it.
    persisted: watch::Sender<u64>,
    failures: AtomicU64,
}

/// Persists the highest version a client observed under one key, in a background task that retries until the
/// store succeeds (see the module docs). Dropping it stops the task.
#[derive(Debug)]
pub struct VersionPersister {
    target: watch::Sender<u64>,
    counters: Arc<Counters>,
}

impl VersionPersister {
    /// Starts persisting `key` on the current tokio runtime. `persisted` is what the store already holds (its
    /// `load` at start): only higher versions are written.
    ///
    /// # Panics
    /// Outside a tokio runtime (like `tokio::spawn`).
    pub fn spawn(
        store: SharedVersionStore,
        key: impl Into<String>,
        persisted: u64,
        policy: PersistPolicy,
        observer: Arc<dyn PersistObserver>,
    ) -> Self {
        let (target, rx) = watch::channel(persisted);
        let counters = Arc::new(Counters {
            persisted: watch::Sender::new(persisted),
            failures: AtomicU64::new(0),
        });
        let task = Task {
            store,
            key: key.into(),
            policy,
            observer,
            counters: counters.clone(),
        };
        tokio::spawn(task.run(rx));
        VersionPersister { target, counters }
    }

    /// Records that `version` was observed; it is written in the background if it is the highest so far.
    /// Never waits.
    pub fn observe(&self, version: u64) {
        self.target.send_if_modified(|current| {
            if version > *current {
                *current = version;
                true
            } else {
                false
            }
        });
    }

    /// The highest version known to be in the store.
    pub fn persisted(&self) -> u64 {
        *self.counters.persisted.borrow()
    }

    /// Waits until every version observed so far is in the store, for at most `timeout` (a client closing
    /// gracefully, so the next process starts from what this one saw). Returns whether it is.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let target = *self.target.borrow();
        let mut persisted = self.counters.persisted.subscribe();
        let reached = tokio::time::timeout(timeout, persisted.wait_for(|p| *p >= target)).await;
        matches!(reached, Ok(Ok(_)))
    }

    /// Failed write attempts so far.
    pub fn failures(&self) -> u64 {
        self.counters.failures.load(Ordering::Relaxed)
    }

    /// Whether a version was observed that the store does not hold yet.
    pub fn is_behind(&self) -> bool {
        *self.target.borrow() > self.persisted()
    }
}

struct Task {
    store: SharedVersionStore,
    key: String,
    policy: PersistPolicy,
    observer: Arc<dyn PersistObserver>,
    counters: Arc<Counters>,
}

impl Task {
    /// Runs until the [`VersionPersister`] is dropped.
    async fn run(self, mut rx: watch::Receiver<u64>) {
        let mut persisted = *self.counters.persisted.borrow();
        let mut failures_in_row = 0u32;
        loop {
            let target = *rx.borrow_and_update();
            if target <= persisted {
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let attempt = tokio::time::timeout(self.policy.attempt_timeout, self.store.store(&self.key, target));
            let result = match attempt.await {
                Ok(r) => r,
                Err(_) => Err(VersionStoreError::TimedOut(self.policy.attempt_timeout)),
            };
            match result {
                Ok(()) => {
                    persisted = target;
                    self.counters.persisted.send_replace(target);
                    if failures_in_row > 0 {
                        tracing::info!(key = %self.key, version = target, failed_attempts = failures_in_row,
                            "the highest observed version is persisted again");
                    }
                    failures_in_row = 0;
                    self.observer.persisted(target);
                }
                Err(e) => {
                    failures_in_row = failures_in_row.saturating_add(1);
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    let wait = self.policy.backoff(failures_in_row);
                    tracing::warn!(key = %self.key, version = target, attempt = failures_in_row, retry_in = ?wait,
                        error = %e, "cannot persist the highest observed version; retrying (the client keeps \
                        working within its leases, but a restart now would forget this version)");
                    self.observer.failed(target, &e);
                    let sleep = tokio::time::sleep(wait);
                    tokio::pin!(sleep);
                    loop {
                        tokio::select! {
                            _ = &mut sleep => break,
                            changed = rx.changed() => if changed.is_err() { return },
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FailingVersionStore;
    use crate::version_store::{MemoryVersionStore, VersionStore};
    use std::sync::Mutex;

    /// Fast retries, so the tests run in milliseconds of real time.
    fn fast() -> PersistPolicy {
        PersistPolicy::default()
            .with_retry(Duration::from_millis(1), Duration::from_millis(4))
            .with_attempt_timeout(Duration::from_millis(50))
    }

    /// Waits (up to 10 s) until `done` holds.
    async fn until(done: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "condition not reached");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[derive(Default)]
    struct Events(Mutex<Vec<String>>);

    impl PersistObserver for Events {
        fn failed(&self, version: u64, _error: &VersionStoreError) {
            self.0.lock().unwrap().push(format!("failed {version}"));
        }

        fn persisted(&self, version: u64) {
            self.0.lock().unwrap().push(format!("persisted {version}"));
        }
    }

    #[tokio::test]
    async fn a_failing_store_is_retried_until_it_takes_the_version_without_a_new_observation() {
        let flaky = FailingVersionStore::failing_first(3);
        let store = SharedVersionStore::new(flaky.clone());
        let events = Arc::new(Events::default());
        let p = VersionPersister::spawn(store, "k", 0, fast(), events.clone());
        p.observe(5);
        assert!(p.flush(Duration::from_secs(10)).await, "flush waits for the retries");
        assert_eq!(p.persisted(), 5);
        assert_eq!(flaky.stored("k").await, 5);
        assert_eq!(p.failures(), 3);
        assert!(!p.is_behind());
        assert_eq!(
            *events.0.lock().unwrap(),
            ["failed 5", "failed 5", "failed 5", "persisted 5"]
        );
    }

    #[tokio::test]
    async fn a_store_that_hangs_counts_as_failed() {
        struct Hangs;
        impl VersionStore for Hangs {
            async fn load(&self, _key: &str) -> Result<u64, VersionStoreError> {
                Ok(0)
            }
            async fn store(&self, _key: &str, _version: u64) -> Result<(), VersionStoreError> {
                std::future::pending().await
            }
        }
        let events = Arc::new(Events::default());
        let p = VersionPersister::spawn(SharedVersionStore::new(Hangs), "k", 0, fast(), events.clone());
        p.observe(2);
        assert!(
            !p.flush(Duration::from_millis(20)).await,
            "a flush gives up at its deadline"
        );
        until(|| p.failures() >= 2).await;
        assert!(events.0.lock().unwrap().iter().all(|e| e == "failed 2"));
        assert!(p.is_behind());
        assert_eq!(p.persisted(), 0);
    }

    #[tokio::test]
    async fn only_growth_is_written_and_the_latest_target_wins() {
        let inner = MemoryVersionStore::new();
        let events = Arc::new(Events::default());
        let p = VersionPersister::spawn(
            SharedVersionStore::new(inner.clone()),
            "k",
            4,
            PersistPolicy::default(),
            events.clone(),
        );
        p.observe(3);
        p.observe(4);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            events.0.lock().unwrap().is_empty(),
            "nothing above what the store holds"
        );
        p.observe(9);
        for _ in 0..100 {
            if p.persisted() == 9 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(inner.load("k").await.unwrap(), 9);
    }
}
