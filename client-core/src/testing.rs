//! Test doubles for the SDKs' tests (feature `test-util`; not for production use).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use protocol::messages::{HeartbeatRequest, HeartbeatResponse, RoutingQuery, RoutingResponse};
use protocol::names::{GroupName, StreamName};
use protocol::Status;
use tokio::time::Instant;

use crate::coord_client::{CoordError, CoordFuture, CoordTransport};
use crate::version_store::{MemoryVersionStore, VersionStore, VersionStoreError};

/// A version store whose writes fail on demand: the first `n` writes ([`Self::failing_first`]), or every write
/// while it is switched off ([`Self::set_failing`]). Reads and successful writes go to an in-memory store.
/// Clones share their state, so a test keeps one to control the store it gave a client.
#[derive(Debug, Clone, Default)]
pub struct FailingVersionStore {
    inner: MemoryVersionStore,
    failing: Arc<AtomicBool>,
    fail_next: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl FailingVersionStore {
    /// A store whose first `n` writes fail.
    pub fn failing_first(n: u64) -> Self {
        let s = FailingVersionStore::default();
        s.fail_next.store(n, Ordering::Relaxed);
        s
    }

    /// Makes every write fail (`true`) or succeed (`false`, once the first-`n` failures are used up).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// Writes that failed so far.
    pub fn failed_writes(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// What the store holds for `key` (0: nothing).
    pub async fn stored(&self, key: &str) -> u64 {
        self.inner.load(key).await.unwrap_or(0)
    }
}

impl VersionStore for FailingVersionStore {
    async fn load(&self, key: &str) -> Result<u64, VersionStoreError> {
        self.inner.load(key).await
    }

    async fn store(&self, key: &str, version: u64) -> Result<(), VersionStoreError> {
        let scheduled = self
            .fail_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if scheduled || self.failing.load(Ordering::Relaxed) {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(VersionStoreError::other("injected version-store failure"));
        }
        self.inner.store(key, version).await
    }
}

/// What [`FakeCoord`] does with one call: an answer, a refusal or an outage, after a delay on Tokio's clock (so
/// under paused time a slow coordinator costs no wall-clock time).
#[derive(Debug, Clone)]
pub struct Reply<T> {
    outcome: Outcome<T>,
    after: Duration,
}

#[derive(Debug, Clone)]
enum Outcome<T> {
    Answer(T),
    Refuse(Status),
    Unreachable,
    Hang,
}

impl<T> Reply<T> {
    /// Answers `value`.
    pub fn answer(value: T) -> Self {
        Reply {
            outcome: Outcome::Answer(value),
            after: Duration::ZERO,
        }
    }

    /// Refuses with `status` ([`CoordError::Status`], as the HTTP client reports an error body).
    pub fn refuse(status: Status) -> Self {
        Reply {
            outcome: Outcome::Refuse(status),
            after: Duration::ZERO,
        }
    }

    /// No coordinator reachable (a retryable [`CoordError`], as after a connection error or a timeout).
    pub fn unreachable() -> Self {
        Reply {
            outcome: Outcome::Unreachable,
            after: Duration::ZERO,
        }
    }

    /// Never answers (the caller's own deadline must end the wait).
    pub fn hang() -> Self {
        Reply {
            outcome: Outcome::Hang,
            after: Duration::ZERO,
        }
    }

    /// The same reply, given `delay` after the call arrived.
    #[must_use]
    pub fn after(mut self, delay: Duration) -> Self {
        self.after = delay;
        self
    }
}

type Script<Req, T> = Box<dyn FnMut(&Req) -> Reply<T> + Send>;

struct FakeState {
    on_heartbeat: Script<HeartbeatRequest, HeartbeatResponse>,
    on_routing: Script<RoutingQuery, RoutingResponse>,
    heartbeats: Vec<(Instant, HeartbeatRequest)>,
    routing_queries: Vec<(Instant, RoutingQuery)>,
}

/// An in-memory coordinator implementing [`CoordTransport`]: each call is recorded with its arrival time on
/// Tokio's clock and answered by a script the test sets ([`Self::on_heartbeat`], [`Self::on_routing`]; by default
/// every call finds the coordinator unreachable). Clones share their state, so a test keeps one to change the
/// script and read the calls while the SDK under test holds another.
#[derive(Clone)]
pub struct FakeCoord {
    state: Arc<Mutex<FakeState>>,
}

impl std::fmt::Debug for FakeCoord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("FakeCoord")
            .field("heartbeats", &s.heartbeats.len())
            .field("routing_queries", &s.routing_queries.len())
            .finish_non_exhaustive()
    }
}

impl Default for FakeCoord {
    fn default() -> Self {
        FakeCoord {
            state: Arc::new(Mutex::new(FakeState {
                on_heartbeat: Box::new(|_| Reply::unreachable()),
                on_routing: Box::new(|_| Reply::unreachable()),
                heartbeats: Vec::new(),
                routing_queries: Vec::new(),
            })),
        }
    }
}

impl FakeCoord {
    /// A coordinator that is unreachable until a script is set.
    pub fn new() -> Self {
        FakeCoord::default()
    }

    /// Answers every following heartbeat with `script(request)`.
    pub fn on_heartbeat(&self, script: impl FnMut(&HeartbeatRequest) -> Reply<HeartbeatResponse> + Send + 'static) {
        self.lock().on_heartbeat = Box::new(script);
    }

    /// Answers every following routing query with `script(query)`.
    pub fn on_routing(&self, script: impl FnMut(&RoutingQuery) -> Reply<RoutingResponse> + Send + 'static) {
        self.lock().on_routing = Box::new(script);
    }

    /// Every heartbeat received so far, with its arrival time.
    pub fn heartbeats(&self) -> Vec<(Instant, HeartbeatRequest)> {
        self.lock().heartbeats.clone()
    }

    /// Every routing query received so far, with its arrival time.
    pub fn routing_queries(&self) -> Vec<(Instant, RoutingQuery)> {
        self.lock().routing_queries.clone()
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // Plain data and scripts: a panicking script (a failed assertion) must not hide the calls.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn deliver<T>(reply: Reply<T>) -> Result<T, CoordError> {
    if !reply.after.is_zero() {
        tokio::time::sleep(reply.after).await;
    }
    match reply.outcome {
        Outcome::Answer(v) => Ok(v),
        Outcome::Refuse(status) => Err(CoordError::Status {
            status,
            message: format!("fake coordinator refused: {status}"),
            member_epoch: None,
            retry_after: None,
        }),
        Outcome::Unreachable => Err(CoordError::Decode {
            url: "fake://coordinator".into(),
            detail: "unreachable (fake coordinator)".into(),
        }),
        Outcome::Hang => std::future::pending().await,
    }
}

impl CoordTransport for FakeCoord {
    fn heartbeat<'a>(
        &'a self,
        _stream: &'a StreamName,
        _group: &'a GroupName,
        req: &'a HeartbeatRequest,
    ) -> CoordFuture<'a, HeartbeatResponse> {
        let reply = {
            let mut s = self.lock();
            s.heartbeats.push((Instant::now(), req.clone()));
            (s.on_heartbeat)(req)
        };
        Box::pin(deliver(reply))
    }

    fn routing<'a>(&'a self, _stream: &'a StreamName, query: RoutingQuery) -> CoordFuture<'a, RoutingResponse> {
        let reply = {
            let mut s = self.lock();
            s.routing_queries.push((Instant::now(), query));
            (s.on_routing)(&query)
        };
        Box::pin(deliver(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::RoutingVersion;

    fn stream() -> StreamName {
        StreamName::new("orders").unwrap()
    }

    fn routing(version: u64) -> RoutingResponse {
        RoutingResponse {
            status: Status::Ok,
            stream: stream(),
            routing_version: RoutingVersion(version),
            shard_count: 4,
            routing_lease_ms: 1000,
            refresh_interval_ms: 300,
            shard_records: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn replies_follow_the_script_and_calls_are_recorded_with_their_arrival() {
        let fake = FakeCoord::new();
        let q = RoutingQuery {
            routing_version: RoutingVersion(0),
            max_observed_version: RoutingVersion(7),
            max_shard_count: 0,
        };
        let err = fake.routing(&stream(), q).await.unwrap_err();
        assert!(err.is_retryable(), "unreachable by default: {err}");
        let mut n = 0;
        fake.on_routing(move |_| {
            n += 1;
            match n {
                1 => Reply::answer(routing(3)).after(Duration::from_secs(2)),
                _ => Reply::refuse(Status::StoreUnavailable),
            }
        });
        let t0 = Instant::now();
        assert_eq!(fake.routing(&stream(), q).await.unwrap(), routing(3));
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(2),
            "answered after the scripted delay"
        );
        let err = fake.routing(&stream(), q).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::StoreUnavailable));
        let calls = fake.routing_queries();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[2].0 - calls[1].0, Duration::from_secs(2));
        assert_eq!(calls[1].1, q);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_call_never_answers() {
        let fake = FakeCoord::new();
        fake.on_routing(|_| Reply::hang());
        let q = RoutingQuery::default();
        let r = tokio::time::timeout(Duration::from_secs(3600), fake.routing(&stream(), q)).await;
        assert!(r.is_err());
    }
}
