//! The member supervisor: the one task that talks to the coordinator, owns the [`Membership`] and the
//! [`Lease`], and starts and stops the shard readers.
//!
//! # Layout
//! * this file: the loop itself (what it waits for, in which order), lease expiry, loss and rejoin, giving the
//!   shards back when Redis is unreadable, close and abort, the published status.
//! * [`heartbeat`]: one heartbeat call and what its answer or failure does (lease grant, assignment changes,
//!   the next heartbeat's time, backoff).
//! * [`readers`]: the bookkeeping of the running shard readers (start, exit, kill within a grace period, read
//!   health).
//!
//! The submodules add methods to the loop's `State` and import only from this file, never the other way round.
//! Every time is read from Tokio's clock ([`now`]), so `tests` (under `supervisor/`) drive the loop under paused
//! time against an in-memory coordinator.
//!
//! # Ordering contract
//! 1. Capture the monotonic send time, then send the heartbeat (join while the epoch is 0).
//! 2. On an answer: grant the lease from that send time, apply the answer ([`Membership::apply`]), stop reads of
//!    what is no longer ours *before* starting anything new, persist a grown max observed version.
//! 3. While waiting (between heartbeats, and while a heartbeat is in flight) watch the lease: when it runs out,
//!    every reader is killed and every shard enters local revoking state, *before* the coordinator can expire the
//!    member (lease <= member TTL, counted from the send time).
//! 4. When a reader finishes draining, heartbeat at once to report the shard `REVOKED`.
//! 5. `FENCED_MEMBER_EPOCH` / `UNKNOWN_MEMBER`: kill every reader, wait for them to stop, call `on_lost`, and only
//!    then join again with epoch 0.
//! 6. Outage (unreachable, `COORDINATOR_TERMINATING` everywhere, `STORE_UNAVAILABLE`, `METADATA_UNAVAILABLE`):
//!    keep reading within the lease, retry with jittered backoff capped at the heartbeat interval. A refusal that
//!    retrying cannot fix (`NOT_FOUND`: the group was never created, `INVALID_REQUEST`, `UNAUTHORIZED`) of the
//!    first join stops the consumer with [`ConsumerError::Coordinator`]; after the member was answered once, it is
//!    retried with the same backoff and a warning per attempt.
//! 7. Redis unreadable: when a reader has failed to reach Redis for longer than `read_failure_timeout`, kill every
//!    reader, leave the group (every shard reported revoked, so the coordinator moves them at once), call
//!    `on_lost`, and join again only once Redis passes the start-up check.
//! 8. Every other await of the loop (stopping readers, callbacks) watches the lease too, and `on_lost` is bounded
//!    by `listener_timeout`; version-store writes run in the background (`client_core::persist`): nothing the loop
//!    waits for can keep readers running past the lease.
//! 9. Close: stop new reads everywhere, wait for in-flight work up to the drain deadline (still heartbeating, so
//!    the lease holds), kill what is left, report every shard `REVOKED` in one heartbeat, then leave (epoch -1).

mod heartbeat;
mod readers;

use backon::ExponentialBackoff;
use client_core::CoordTransport;
use protocol::{ShardId, Status};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::sleep_until;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::config::ConsumerConfig;
use crate::error::ConsumerError;
use crate::handler::DynListener;
use crate::in_flight::InFlight;
use crate::lease::{now, Lease};
use crate::redis_check::check_redis;
use crate::shard_reader::{ReadHealth, ReaderControl, ReaderExit, ReaderShared};
use crate::status::{CloseReport, ConsumerStatus, HeartbeatCounters};
use client_core::membership::{Membership, ShardState};

/// Leave attempts on close (the member expires by TTL anyway if all fail).
const LEAVE_ATTEMPTS: u32 = 3;
/// Delay of a "prompt" heartbeat (after SYNC_METADATA, a drained shard, a rejoin): short, but a coordinator that
/// kept asking for one could not spin the loop.
const PROMPT_DELAY: Duration = Duration::from_millis(5);

/// A running reader, as the loop sees it.
struct ReaderHandle {
    /// Distinguishes this reader from an earlier one of the same shard whose exit arrives late.
    generation: u64,
    ctl: ReaderControl,
    task: JoinHandle<ReaderExit>,
    in_flight: Arc<InFlight>,
    health: Arc<ReadHealth>,
}

/// A reader's exit, sent by its task.
struct ReaderExitEvent {
    shard: ShardId,
    generation: u64,
    exit: ReaderExit,
}

/// What to do after one heartbeat.
enum Flow {
    /// Next heartbeat at this time.
    Next(Instant),
    /// The consumer was aborted.
    Aborted,
    /// Stop with this error.
    Fatal(ConsumerError),
}

/// Everything the loop needs; built by [`crate::Consumer`].
pub(crate) struct Driver {
    pub config: Arc<ConsumerConfig>,
    /// The coordinator: the HTTP client in production, an in-memory fake in the tests.
    pub transport: Arc<dyn CoordTransport>,
    pub shared: Arc<ReaderShared>,
    pub listener: Arc<dyn DynListener>,
    /// Persists the highest observed metadata version (retrying until the store takes it).
    pub persister: Arc<client_core::VersionPersister>,
    /// The stream's routing version as seen by the clients sharing the version store: raised from every answer,
    /// so a producer of the process learns of a newer routing at once.
    pub routing_observed: client_core::ObservedVersion,
    pub membership: Membership,
    pub status: watch::Sender<ConsumerStatus>,
    /// Cancelled to abort the whole consumer at once (no drain, no leave); readers' kill tokens are children.
    pub kill: CancellationToken,
}

struct State {
    d: Driver,
    client: Arc<dyn CoordTransport>,
    lease: Lease,
    readers: BTreeMap<ShardId, ReaderHandle>,
    next_generation: u64,
    exits_tx: mpsc::UnboundedSender<ReaderExitEvent>,
    exits_rx: mpsc::UnboundedReceiver<ReaderExitEvent>,
    tracker: TaskTracker,
    counters: HeartbeatCounters,
    interval: Duration,
    backoff: Option<ExponentialBackoff>,
    /// Shards whose reader was killed during close (in-flight work dropped).
    killed_on_close: BTreeSet<ShardId>,
    closing: bool,
    /// If the loop's future is dropped (the consumer's task aborted, `run` dropped), every reader stops too.
    _kill_on_drop: DropGuard,
}

impl Driver {
    /// Runs until `shutdown` (graceful close) or the kill token (abort).
    pub(crate) async fn run(self, shutdown: CancellationToken) -> Result<CloseReport, ConsumerError> {
        let client = Arc::clone(&self.transport);
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let interval = self.config.timings.heartbeat_interval;
        let kill_on_drop = self.kill.clone().drop_guard();
        let mut s = State {
            d: self,
            client,
            lease: Lease::default(),
            readers: BTreeMap::new(),
            next_generation: 0,
            exits_tx,
            exits_rx,
            tracker: TaskTracker::new(),
            counters: HeartbeatCounters::default(),
            interval,
            backoff: None,
            killed_on_close: BTreeSet::new(),
            closing: false,
            _kill_on_drop: kill_on_drop,
        };
        info!(group = %s.d.config.group, member_id = %s.d.config.member_id, instance = %s.d.membership.request().instance_id,
            max_observed = %s.d.membership.max_observed(), "consumer starting");
        s.publish();
        let result = s.main_loop(&shutdown).await;
        s.tracker.close();
        match result {
            Ok(true) => Ok(s.finish_close().await),
            Ok(false) => Ok(s.aborted().await),
            Err(e) => {
                let all: Vec<ShardId> = s.readers.keys().copied().collect();
                s.kill_readers(&all).await;
                s.tracker.wait().await;
                s.publish_closed();
                Err(e)
            }
        }
    }
}

impl State {
    /// `Ok(true)`: closing and every reader stopped; `Ok(false)`: aborted.
    async fn main_loop(&mut self, shutdown: &CancellationToken) -> Result<bool, ConsumerError> {
        let mut next_at = now();
        let mut drain_deadline: Option<Instant> = None;
        loop {
            if self.closing && self.readers.is_empty() {
                return Ok(true);
            }
            let lease_end = self.lease_watch();
            tokio::select! {
                biased;
                _ = self.d.kill.cancelled() => return Ok(false),
                _ = shutdown.cancelled(), if !self.closing => {
                    self.begin_close();
                    drain_deadline = now().checked_add(self.d.config.timings.drain_timeout);
                    continue;
                }
                Some(ev) = self.exits_rx.recv() => {
                    if self.on_exit(ev) {
                        next_at = next_at.min(prompt());
                    }
                    continue;
                }
                _ = sleep_until_opt(lease_end) => {
                    self.expire_lease().await;
                    continue;
                }
                _ = sleep_until_opt(drain_deadline.filter(|_| !self.readers.is_empty())) => {
                    warn!(group = %self.d.config.group, shards = ?self.readers.keys().collect::<Vec<_>>(),
                        "drain deadline passed: dropping in-flight work");
                    let left: Vec<ShardId> = self.readers.keys().copied().collect();
                    self.killed_on_close.extend(left.iter().copied());
                    self.kill_readers(&left).await;
                    continue;
                }
                _ = sleep_until(next_at.into()) => {}
            }
            if let Some((shard, failing_for)) = self.unreadable() {
                if !self.give_back(shard, failing_for, shutdown).await {
                    return Ok(false);
                }
                next_at = prompt();
                continue;
            }
            match self.heartbeat().await {
                Flow::Next(at) => next_at = at,
                Flow::Aborted => return Ok(false),
                Flow::Fatal(e) => return Err(e),
            }
        }
    }

    /// The lease end to watch: only while some reader runs (nothing to stop otherwise).
    fn lease_watch(&self) -> Option<Instant> {
        if self.readers.is_empty() {
            None
        } else {
            // No lease while readers run cannot happen (readers start only under a valid lease); treat it as
            // expired, which stops them.
            Some(self.lease.expires_at().unwrap_or_else(now))
        }
    }

    /// Fenced or forgotten: kill every reader, wait, report lost, rejoin (epoch 0) on the next heartbeat.
    async fn lost(&mut self, status: Status, why: &str) {
        self.count(status);
        self.d.membership.record_status(status);
        warn!(group = %self.d.config.group, member_id = %self.d.config.member_id, %status, reason = why,
            "member lost its assignment: stopping every reader, then rejoining");
        // Forget first (it lists the shards that had a reader), then stop the readers.
        let lost = self.d.membership.lose_all();
        let all: Vec<ShardId> = self.readers.keys().copied().collect();
        self.kill_readers(&all).await;
        self.lease.revoke();
        self.d.shared.lease.publish(&self.lease);
        self.counters.rejoins += 1;
        self.d.shared.metrics.rejoined();
        self.call_on_lost(lost).await;
        self.publish();
    }

    /// Another process holds the member id: stop every reader and report the shards lost; the caller ends the
    /// consumer (no rejoin: the two processes would replace each other in turn).
    async fn replaced(&mut self, e: &client_core::CoordError) {
        self.count(Status::MemberReplaced);
        self.d.membership.record_status(Status::MemberReplaced);
        error!(group = %self.d.config.group, member_id = %self.d.config.member_id, error = %e,
            "another process joined under this member id and holds it now: stopping every reader and the consumer");
        let lost = self.d.membership.lose_all();
        let all: Vec<ShardId> = self.readers.keys().copied().collect();
        self.kill_readers(&all).await;
        self.lease.revoke();
        self.d.shared.lease.publish(&self.lease);
        self.call_on_lost(lost).await;
        self.publish();
    }

    /// The lease ran out without a successful heartbeat: stop reading everything now.
    async fn expire_lease(&mut self) {
        self.counters.lease_expiries += 1;
        self.d.shared.metrics.lease_expired();
        warn!(group = %self.d.config.group, member_id = %self.d.config.member_id,
            "assignment lease ran out without a successful heartbeat: every shard enters local revoking state");
        let stopped = self.d.membership.revoke_all();
        self.kill_readers(&stopped).await;
        self.call_on_lost(stopped).await;
        self.publish();
    }

    /// `on_lost`, bounded by `listener_timeout` (the lease is gone: nothing else bounds it).
    async fn call_on_lost(&self, shards: Vec<ShardId>) {
        if shards.is_empty() {
            return;
        }
        let limit = self.d.config.timings.listener_timeout;
        if tokio::time::timeout(limit, self.d.listener.on_lost(shards))
            .await
            .is_err()
        {
            warn!(group = %self.d.config.group, timeout = ?limit, "on_lost ran past listener_timeout; dropped");
        }
    }

    /// A reader could not read from Redis for too long: give every shard back so it moves to a member that can
    /// read it. Readers stop first, then the member leaves (each shard reported revoked, so the coordinator
    /// releases them at once; if the leave is lost, the member TTL does it), then `on_lost`. The next join waits
    /// until Redis passes the start-up check again. Returns `false` when aborted meanwhile.
    async fn give_back(&mut self, shard: ShardId, failing_for: Duration, shutdown: &CancellationToken) -> bool {
        let c = Arc::clone(&self.d.config);
        self.counters.redis_give_backs += 1;
        self.d.shared.metrics.gave_back_for_redis();
        warn!(group = %c.group, member_id = %c.member_id, %shard, ?failing_for, bound = ?c.timings.read_failure_timeout,
            redis = %protocol::redact::redact_url(&c.redis_url),
            "cannot read from Redis: giving every shard back (leaving the group) so they move to members that can \
             read them; joining again once Redis answers");
        let stopped = self.d.membership.revoke_all();
        self.kill_readers(&stopped).await;
        if self.d.membership.is_joined() {
            let leave = self.d.membership.leave_request();
            let call = self.client.heartbeat(&c.stream, &c.group, &leave);
            match tokio::time::timeout(c.timings.request_timeout, call).await {
                Ok(Ok(_)) => info!(group = %c.group, member_id = %c.member_id, "left the group"),
                Ok(Err(e)) => warn!(group = %c.group, error = %e,
                    "leave failed; the coordinator moves the shards when the member TTL runs out"),
                Err(_) => warn!(group = %c.group,
                    "leave timed out; the coordinator moves the shards when the member TTL runs out"),
            }
        }
        self.d.membership.lose_all();
        self.lease.revoke();
        self.d.shared.lease.publish(&self.lease);
        self.call_on_lost(stopped).await;
        self.publish();
        let mut delay = Duration::from_millis(100);
        loop {
            tokio::select! {
                biased;
                _ = self.d.kill.cancelled() => return false,
                _ = shutdown.cancelled() => return true,
                r = check_redis(&self.d.shared.redis, &c) => match r {
                    Ok(()) => {
                        info!(group = %c.group, member_id = %c.member_id, "Redis answers again: joining");
                        return true;
                    }
                    Err(e) => debug!(group = %c.group, error = %e, "Redis still unusable"),
                },
            }
            tokio::select! {
                biased;
                _ = self.d.kill.cancelled() => return false,
                _ = shutdown.cancelled() => return true,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(self.interval.max(Duration::from_millis(100)));
        }
    }

    fn begin_close(&mut self) {
        info!(group = %self.d.config.group, member_id = %self.d.config.member_id,
            "closing: stopping new reads, waiting for in-flight work");
        self.closing = true;
        self.d.membership.set_closing();
        for shard in self.d.membership.revoke_all() {
            if let Some(h) = self.readers.get(&shard) {
                h.ctl.stop.cancel();
            }
        }
        self.publish();
    }

    /// After every reader stopped: report every shard revoked, then leave.
    async fn finish_close(mut self) -> CloseReport {
        if self.d.membership.is_joined() && !self.d.membership.revoking().is_empty() {
            let req = self.d.membership.request();
            match self
                .client
                .heartbeat(&self.d.config.stream, &self.d.config.group, &req)
                .await
            {
                Ok(resp) => {
                    self.count(resp.status);
                    self.d.membership.apply(&resp, false);
                }
                Err(e) => debug!(group = %self.d.config.group, error = %e, "revoke report before leaving failed"),
            }
        }
        let leave = self.d.membership.leave_request();
        let mut left = false;
        for attempt in 0..LEAVE_ATTEMPTS {
            match self
                .client
                .heartbeat(&self.d.config.stream, &self.d.config.group, &leave)
                .await
            {
                Ok(_) => {
                    left = true;
                    break;
                }
                Err(e) if e.is_retryable() && attempt + 1 < LEAVE_ATTEMPTS => {
                    debug!(group = %self.d.config.group, error = %e, "leave failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(e) => {
                    warn!(group = %self.d.config.group, member_id = %self.d.config.member_id, error = %e,
                        "could not leave the group; the coordinator expires the member after its TTL");
                    break;
                }
            }
        }
        if left {
            info!(group = %self.d.config.group, member_id = %self.d.config.member_id, "left the group");
        }
        self.d.membership.set_left();
        self.lease.revoke();
        self.d.shared.lease.publish(&self.lease);
        self.tracker.wait().await;
        self.publish_closed();
        CloseReport {
            left,
            killed_shards: self.killed_on_close.iter().copied().collect(),
        }
    }

    /// Abort: every reader is killed (its token is a child of the cancelled kill token); nothing is reported.
    async fn aborted(mut self) -> CloseReport {
        let all: Vec<ShardId> = self.readers.keys().copied().collect();
        self.kill_readers(&all).await;
        self.tracker.wait().await;
        self.lease.revoke();
        self.d.shared.lease.publish(&self.lease);
        self.publish_closed();
        CloseReport {
            left: false,
            killed_shards: all,
        }
    }

    fn snapshot(&self) -> ConsumerStatus {
        let m = &self.d.membership;
        ConsumerStatus {
            member_id: m.member_id().clone(),
            joined: m.is_joined(),
            member_epoch: m.epoch(),
            metadata_version: m.metadata_version(),
            max_observed_version: m.max_observed(),
            assignment_epoch: m.assignment_epoch(),
            reading: m.shards_in(ShardState::Reading),
            revoking: m.revoking(),
            pending: m.pending().to_vec(),
            in_flight: self
                .readers
                .iter()
                .map(|(&s, h)| (s, h.in_flight.current()))
                .filter(|(_, n)| *n > 0)
                .collect(),
            last_status: m.last_status(),
            lease_expires_at: self.lease.expires_at(),
            heartbeats: self.counters,
            closed: false,
        }
    }

    /// Counts a heartbeat answer (or refusal) by status, in the counters and the metrics.
    fn count(&mut self, status: Status) {
        self.counters.count(status);
        self.d.shared.metrics.heartbeat(status.as_str());
    }

    /// Publishes the status. The gauges are set first, so whoever sees the status can already read them.
    fn publish(&self) {
        let s = self.snapshot();
        self.record_gauges(&s, self.lease.remaining_at(now()));
        self.d.status.send_replace(s);
    }

    fn publish_closed(&self) {
        let mut s = self.snapshot();
        s.closed = true;
        s.joined = false;
        // Closed: nothing is read whatever the lease said (the error path stops without revoking it).
        self.record_gauges(&s, Duration::ZERO);
        self.d.status.send_replace(s);
    }

    fn record_gauges(&self, s: &ConsumerStatus, lease_remaining: Duration) {
        self.d.shared.metrics.status(
            lease_remaining,
            s.reading.len(),
            s.revoking.len(),
            s.max_observed_version.0,
        );
    }
}

/// When a prompt heartbeat goes out: at once, but never in a tight loop.
fn prompt() -> Instant {
    now() + PROMPT_DELAY
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
