//! The critical section, written once for every writer of a hash (group sections, routing sections, group
//! creation).
//!
//! # Ordering contract
//! 1. pass the shutdown gate (refused with `COORDINATOR_TERMINATING` once shutdown began);
//! 2. take the hash's Redis mutex and load (one script, [`Store::try_load`]), retrying while it is busy up to
//!    the critical-section deadline;
//! 3. decide, purely, on what was loaded and Redis `TIME` ([`Section::decide`]);
//! 4. write with the revision compare-and-set (one script, which also releases the mutex);
//! 5. answer from what was written. A conflict goes back to step 2 (or ends the section, when
//!    [`Section::conflict`] says so); nothing is answered from an unwritten state.
//!
//! The caller holds the group's local lock, if it has one, around [`run`]: requests of one group queue there
//! instead of spinning on Redis.

use protocol::StoreRevision;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

use crate::error::{Error, StoreError};
use crate::shutdown::ShutdownGate;
use crate::spans::{self, Boundary};
use crate::stats::Stats;
use crate::store::{Cached, Committed, LivenessScope, Loaded, SectionKeys, Store, Write};

/// How many times a critical section reloads after losing a compare-and-set.
pub(crate) const MAX_CAS_ATTEMPTS: usize = 5;

/// What a decision asks for.
pub(crate) enum Verdict<T> {
    /// Write nothing: release the mutex and answer this.
    Answer(T),
    /// Write [`Section::write`], then answer [`Section::committed`].
    Write,
}

/// One kind of critical section: what it loads, how it decides, what it writes. The steps run in the order of
/// the module docs; the hooks with a default are for the kinds that need them.
pub(crate) trait Section {
    /// The answer.
    type Output;

    /// Called before every load (a retry reloads what this process remembers).
    fn prepare(&mut self) {}

    /// The aggregate this process has parsed already: the load skips sending it while it is current.
    fn cached(&self) -> Option<Cached<'_>> {
        None
    }

    /// Which liveness entries to load.
    fn scope(&self) -> LivenessScope<'_> {
        LivenessScope::None
    }

    /// Looks at what was loaded before deciding (a lookup the decision needs); an error refuses as
    /// [`Section::decide`]'s does.
    async fn check(&mut self, store: &Store, keys: &SectionKeys, loaded: &Loaded) -> Result<(), Error> {
        let _ = (store, keys, loaded);
        Ok(())
    }

    /// Decides on one load; an error refuses (nothing is written, the mutex is released).
    fn decide(&mut self, loaded: &Loaded) -> Result<Verdict<Self::Output>, Error>;

    /// The answer to a refusal, looked up after the mutex is released.
    async fn refused(&mut self, loaded: &Loaded, e: Error) -> Error {
        let _ = loaded;
        e
    }

    /// Runs between the decision and the write (fault injection, clearing leftovers). An error ends the section
    /// with the mutex still held (it expires by its TTL): as if the process had died there.
    async fn before_write(&mut self, store: &Store, keys: &SectionKeys) -> Result<(), Error> {
        let _ = (store, keys);
        Ok(())
    }

    /// What to write after [`Verdict::Write`], compared against the loaded revisions.
    fn write<'a>(&'a self, loaded: &'a Loaded) -> Write<'a>;

    /// The answer to a write that failed (Redis error, corrupt hash).
    fn write_failed(&mut self, e: StoreError) -> Error {
        e.into()
    }

    /// The answer once the write is in, at revision `revision`.
    async fn committed(&mut self, revision: StoreRevision) -> Result<Self::Output, Error>;

    /// Another writer won the compare-and-set: `Ok` reloads and decides again, an error is the answer.
    fn conflict(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// What every section runs against: the store, the shutdown gate, the counters and the mutex timings.
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    /// The store.
    pub store: &'a Store,
    /// The shutdown gate.
    pub gate: &'a ShutdownGate,
    /// The counters.
    pub stats: &'a Stats,
    /// The mutex's `PX`.
    pub mutex_ttl: Duration,
    /// How long to wait for a busy mutex.
    pub deadline: Duration,
}

/// Runs `section` over `keys` (see the module docs).
pub(crate) async fn run<S: Section>(env: Env<'_>, keys: &SectionKeys, section: &mut S) -> Result<S::Output, Error> {
    let _entered = env.gate.enter().ok_or(Error::Terminating)?;
    let token = env.store.token();
    for _ in 0..MAX_CAS_ATTEMPTS {
        section.prepare();
        let loaded = acquire(env, keys, &token, section.cached(), section.scope()).await?;
        spans::reached(Boundary::Loaded, loaded.revision);
        let decided = match section.check(env.store, keys, &loaded).await {
            Ok(()) => section.decide(&loaded),
            Err(e) => Err(e),
        };
        match decided {
            Err(e) => {
                release_quietly(env.store, keys, &token).await;
                spans::reached(Boundary::Released, loaded.revision);
                return Err(section.refused(&loaded, e).await);
            }
            Ok(Verdict::Answer(answer)) => {
                spans::reached(Boundary::Decided, loaded.revision);
                env.store.release(keys, &token).await?;
                spans::reached(Boundary::Released, loaded.revision);
                return Ok(answer);
            }
            Ok(Verdict::Write) => spans::reached(Boundary::Decided, loaded.revision),
        }
        section.before_write(env.store, keys).await?;
        let committed = env
            .store
            .commit(
                keys,
                &token,
                loaded.revision,
                loaded.liveness_revision,
                &section.write(&loaded),
            )
            .await;
        match committed.map_err(|e| section.write_failed(e))? {
            Committed::Ok(rev) => {
                spans::reached(Boundary::Committed, Some(rev));
                return section.committed(rev).await;
            }
            Committed::Conflict => {
                section.conflict()?;
                env.stats.revision_conflicts.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Err(StoreError::CasExhausted { key: keys.hash.clone() }.into())
}

/// Mutex + load, retrying while the mutex is busy, up to the critical-section deadline.
async fn acquire(
    env: Env<'_>,
    keys: &SectionKeys,
    token: &str,
    cached: Option<Cached<'_>>,
    scope: LivenessScope<'_>,
) -> Result<Loaded, Error> {
    let mut wait = MutexWait::new(env.deadline);
    loop {
        let loaded = env
            .store
            .try_load(keys, token, env.mutex_ttl, cached, scope)
            .await
            .map_err(|e| store_error(env.stats, e))?;
        if let Some(loaded) = loaded {
            env.stats.observe_mutex_wait(wait.waited());
            return Ok(loaded);
        }
        env.stats.mutex_busy.fetch_add(1, Ordering::Relaxed);
        let Some(pause) = wait.next_pause() else {
            env.stats.mutex_timeouts.fetch_add(1, Ordering::Relaxed);
            let waited_ms = wait.waited().as_millis() as u64;
            return Err(StoreError::MutexBusy {
                key: keys.mutex.clone(),
                waited_ms,
            }
            .into());
        };
        tokio::time::sleep(pause).await;
    }
}

/// The wait for a busy mutex, on Tokio's clock: exponential backoff with jitter up to the critical-section
/// deadline. Also the wait for a token's group-create mutex (`coordinator/quota/lock.rs`).
pub(crate) struct MutexWait {
    started: Instant,
    /// A stop of this process while it waits is forgiven once: the mutex was not busy for that long.
    deadline: crate::deadline::Deadline,
    backoff: Duration,
}

impl MutexWait {
    /// The longest pause between two tries.
    const MAX_BACKOFF: Duration = Duration::from_millis(50);

    pub(crate) fn new(limit: Duration) -> Self {
        MutexWait {
            started: Instant::now(),
            deadline: crate::deadline::Deadline::after(limit),
            backoff: Duration::from_millis(1),
        }
    }

    /// After a busy try: how long to pause before the next one, or `None` to give up (the deadline passed, or
    /// would before the next try).
    pub(crate) fn next_pause(&mut self) -> Option<Duration> {
        if self.deadline.passed() || Instant::now() + self.backoff > self.deadline.at() {
            return None;
        }
        let jitter = Duration::from_micros(rand::random::<u64>() % 1000);
        let pause = self.backoff + jitter;
        self.backoff = (self.backoff * 2).min(Self::MAX_BACKOFF);
        Some(pause)
    }

    /// How long it has waited so far.
    fn waited(&self) -> Duration {
        self.started.elapsed()
    }
}

async fn release_quietly(store: &Store, keys: &SectionKeys, token: &str) {
    if let Err(e) = store.release(keys, token).await {
        warn!(mutex = %keys.mutex, error = %e, "mutex release failed; it expires by its TTL");
    }
}

/// A store error as answered: a corrupt hash counts as unreadable metadata.
pub(crate) fn store_error(stats: &Stats, e: StoreError) -> Error {
    match e {
        StoreError::Corrupt(message) => {
            stats.metadata_corrupt.fetch_add(1, Ordering::Relaxed);
            unavailable(stats, message)
        }
        other => Error::Store(other),
    }
}

/// Metadata that is missing or unreadable, counted.
pub(crate) fn unavailable(stats: &Stats, message: String) -> Error {
    stats.metadata_unavailable.fetch_add(1, Ordering::Relaxed);
    stats.metrics().metadata_unreadable(&message);
    Error::MetadataUnavailable(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_millis(1500);

    /// Pauses as told until the wait gives up; returns the pauses.
    async fn wait_out(wait: &mut MutexWait) -> Vec<Duration> {
        let mut pauses = Vec::new();
        while let Some(pause) = wait.next_pause() {
            pauses.push(pause);
            tokio::time::sleep(pause).await;
        }
        pauses
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_mutex_is_retried_with_a_growing_capped_backoff_until_the_deadline() {
        let mut wait = MutexWait::new(LIMIT);
        let pauses = wait_out(&mut wait).await;
        assert!(pauses[0] < Duration::from_millis(2), "{pauses:?}");
        assert!(
            pauses.windows(2).all(|w| w[1] + Duration::from_millis(1) >= w[0]),
            "{pauses:?}"
        );
        assert!(pauses
            .iter()
            .all(|p| *p < MutexWait::MAX_BACKOFF + Duration::from_millis(1)));
        // Given up when the next pause would end past the deadline: within one backoff of it, and past it by no
        // more than a jitter (plus the timer's millisecond rounding).
        assert!(wait.waited() <= LIMIT + Duration::from_millis(2), "{:?}", wait.waited());
        assert!(wait.waited() + MutexWait::MAX_BACKOFF + Duration::from_millis(1) > LIMIT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_of_this_process_during_the_wait_is_forgiven_once() {
        let mut wait = MutexWait::new(LIMIT);
        assert!(wait.next_pause().is_some());
        // Stopped for 10 s (SIGSTOP): found late, the deadline moves once to one limit from now.
        tokio::time::advance(Duration::from_secs(10)).await;
        let resumed = Instant::now();
        assert!(wait.next_pause().is_some(), "the stop is forgiven");
        wait_out(&mut wait).await;
        let after_resume = resumed.elapsed();
        assert!(
            after_resume <= LIMIT + Duration::from_millis(2) && after_resume + MutexWait::MAX_BACKOFF * 2 > LIMIT,
            "{after_resume:?}"
        );
        // A second stop is not forgiven.
        let mut wait = MutexWait::new(LIMIT);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(wait.next_pause().is_some());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(wait.next_pause().is_none(), "forgiven only once");
    }
}
