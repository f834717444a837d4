//! The heartbeat loop: the one task that talks to the coordinator, owns the [`Membership`] and the
//! [`Lease`], and starts and stops the shard readers.
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

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use client_core::{CoordClient, CoordError};
use futures::FutureExt;
use protocol::messages::HeartbeatResponse;
use protocol::{ShardId, Status};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
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
use crate::lease::{effective_lease, Lease};
use crate::membership::{Membership, ShardState};
use crate::metrics::failure_status;
use crate::redis_check::check_redis;
use crate::shard_reader::{self, ReadHealth, ReaderControl, ReaderExit, ReaderShared};
use crate::status::{CloseReport, ConsumerStatus, HeartbeatCounters};

/// How long a killed reader may take to stop before its task is aborted.
const KILL_GRACE: Duration = Duration::from_secs(3);
/// Delay of a "prompt" heartbeat (after SYNC_METADATA, a drained shard, a rejoin): short, but a coordinator that
/// kept asking for one could not spin the loop.
const PROMPT_DELAY: Duration = Duration::from_millis(5);
/// Leave attempts on close (the member expires by TTL anyway if all fail).
const LEAVE_ATTEMPTS: u32 = 3;

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
    client: Arc<CoordClient>,
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

fn coord_client(config: &ConsumerConfig) -> Result<CoordClient, CoordError> {
    CoordClient::new(
        config.coordinator_urls.clone(),
        config.timings.request_timeout,
        config.coordinator_token.clone(),
    )
}

impl Driver {
    /// Runs until `shutdown` (graceful close) or the kill token (abort).
    pub(crate) async fn run(self, shutdown: CancellationToken) -> Result<CloseReport, ConsumerError> {
        let client = Arc::new(coord_client(&self.config).map_err(ConsumerError::CoordinatorClient)?);
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
        let mut next_at = Instant::now();
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
                    drain_deadline = Instant::now().checked_add(self.d.config.timings.drain_timeout);
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
            Some(self.lease.expires_at().unwrap_or_else(Instant::now))
        }
    }

    /// One heartbeat, watching the lease and reader exits while it is in flight.
    async fn heartbeat(&mut self) -> Flow {
        let req = self.d.membership.request();
        let client = Arc::clone(&self.client);
        let (stream, group) = (self.d.config.stream.clone(), self.d.config.group.clone());
        let joining = req.member_epoch.is_join();
        // Captured before sending: the lease counts from here (see `crate::lease`).
        let sent_at = Instant::now();
        let call = async move { client.heartbeat(&stream, &group, &req).await };
        tokio::pin!(call);
        // A shard drained while this heartbeat was in flight is reported by the next one, sent at once.
        let mut drained_meanwhile = false;
        let result = loop {
            let lease_end = self.lease_watch();
            tokio::select! {
                biased;
                _ = self.d.kill.cancelled() => return Flow::Aborted,
                r = &mut call => break r,
                Some(ev) = self.exits_rx.recv() => drained_meanwhile |= self.on_exit(ev),
                _ = sleep_until_opt(lease_end) => self.expire_lease().await,
            }
        };
        let flow = self.after_heartbeat(result, sent_at, joining).await;
        match flow {
            Flow::Next(_) if drained_meanwhile => Flow::Next(prompt()),
            other => other,
        }
    }

    async fn after_heartbeat(
        &mut self,
        result: Result<HeartbeatResponse, CoordError>,
        sent_at: Instant,
        joining: bool,
    ) -> Flow {
        match result {
            Ok(resp) if resp.member_epoch.is_leave() => {
                // Not a member any more (only a leave answers -1): same as UNKNOWN_MEMBER.
                self.lost(Status::UnknownMember, "answer without a member epoch").await;
                Flow::Next(prompt())
            }
            Ok(resp) => self.on_answer(resp, sent_at).await,
            Err(e) if e.requires_rejoin() => {
                let status = e.status().unwrap_or(Status::UnknownMember);
                self.lost(status, &e.to_string()).await;
                Flow::Next(prompt())
            }
            Err(e) => self.on_failure(e, joining),
        }
    }

    async fn on_answer(&mut self, resp: HeartbeatResponse, sent_at: Instant) -> Flow {
        self.count(resp.status);
        let t = &self.d.config.timings;
        self.backoff = None;
        let lease = effective_lease(
            Duration::from_millis(resp.assignment_lease_ms),
            t.assignment_lease,
            t.lease_safety_margin,
        );
        // The coordinator's interval, but never so long that the lease runs out between two heartbeats.
        self.interval = Duration::from_millis(resp.heartbeat_interval_ms)
            .min(lease / 2)
            .max(Duration::from_millis(1));
        self.lease.grant(sent_at, lease);
        self.d.shared.lease.publish(&self.lease);
        let was_joined = self.d.membership.is_joined();
        let now = Instant::now();
        let actions = self.d.membership.apply(&resp, self.lease.is_valid_at(now));
        if !was_joined {
            info!(group = %self.d.config.group, member_id = %resp.member_id, epoch = %resp.member_epoch,
                metadata_version = %resp.metadata_version, "joined the group");
        }
        if !actions.drain.is_empty() || !actions.start.is_empty() {
            self.d.shared.metrics.rebalanced();
            info!(group = %self.d.config.group, member_id = %resp.member_id, status = %resp.status,
                metadata_version = %resp.metadata_version, epoch = %resp.member_epoch,
                drain = ?actions.drain, start = ?actions.start, pending = ?resp.pending, "assignment changed");
        }
        // Stop what is no longer ours before starting anything new.
        for shard in &actions.drain {
            if let Some(h) = self.readers.get(shard) {
                h.ctl.stop.cancel();
            }
        }
        for &shard in &actions.start {
            self.start_reader(shard);
        }
        if let Some(v) = actions.max_observed_grew {
            // Written in the background and retried until it succeeds: the loop that watches the lease never waits.
            self.d.persister.observe(v.0);
        }
        self.d.routing_observed.raise(resp.routing_version.0);
        self.publish();
        if actions.prompt {
            Flow::Next(prompt())
        } else {
            Flow::Next(sent_at + self.interval)
        }
    }

    fn on_failure(&mut self, e: CoordError, joining: bool) -> Flow {
        self.counters.failed += 1;
        self.d.shared.metrics.heartbeat(failure_status(&e));
        if let Some(status) = e.status() {
            self.d.membership.record_status(status);
        }
        if !e.is_retryable() && joining && self.counters.answers() == 0 {
            error!(group = %self.d.config.group, error = %e, "the coordinator refused the consumer");
            return Flow::Fatal(ConsumerError::Coordinator(e));
        }
        let delay = self
            .backoff
            .get_or_insert_with(|| {
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(50))
                    .with_max_delay(self.interval)
                    .with_jitter()
                    .with_jitter_seed(rand::random())
                    .without_max_times()
                    .build()
            })
            .next()
            .unwrap_or(self.interval)
            .min(self.interval);
        let now = Instant::now();
        if joining {
            // Nothing is read before a join is answered: there is no lease to read on within.
            warn!(group = %self.d.config.group, member_id = %self.d.config.member_id, error = %e, retry_in = ?delay,
                "cannot join the group yet; retrying");
        } else {
            warn!(group = %self.d.config.group, member_id = %self.d.config.member_id, error = %e, retry_in = ?delay,
                lease_left = ?self.lease.remaining_at(now), "heartbeat failed; reading on within the lease");
        }
        self.publish();
        Flow::Next(now + delay)
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

    /// The shard whose reader has failed to reach Redis the longest, if that is longer than
    /// `read_failure_timeout`.
    fn unreadable(&self) -> Option<(ShardId, Duration)> {
        let now = Instant::now();
        self.readers
            .iter()
            .filter_map(|(&shard, h)| h.health.failing_for(now).map(|d| (shard, d)))
            .max_by_key(|&(_, d)| d)
            .filter(|&(_, d)| d >= self.d.config.timings.read_failure_timeout)
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

    fn start_reader(&mut self, shard: ShardId) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let ctl = ReaderControl {
            stop: CancellationToken::new(),
            kill: self.d.kill.child_token(),
        };
        let in_flight = Arc::new(InFlight::default());
        let health = Arc::new(ReadHealth::default());
        let token = self.d.membership.token(shard);
        let run = shard_reader::run(
            Arc::clone(&self.d.shared),
            shard,
            token,
            ctl.clone(),
            Arc::clone(&in_flight),
            Arc::clone(&health),
        );
        let tx = self.exits_tx.clone();
        let task = self.tracker.spawn(async move {
            // A bug in the reader must not leave the shard marked as read by nobody: report it stopped.
            let exit = AssertUnwindSafe(run).catch_unwind().await.unwrap_or_else(|_| {
                error!(shard = %shard, "shard reader panicked");
                ReaderExit::Killed
            });
            let _ = tx.send(ReaderExitEvent {
                shard,
                generation,
                exit,
            });
            exit
        });
        if let Some(old) = self.readers.insert(
            shard,
            ReaderHandle {
                generation,
                ctl,
                task,
                in_flight,
                health,
            },
        ) {
            // Cannot happen (a shard restarts only once its reader exited); never leave two readers.
            old.ctl.kill.cancel();
        }
    }

    /// A reader exited on its own (drained). Returns whether the shard became revoked (worth a prompt heartbeat).
    fn on_exit(&mut self, ev: ReaderExitEvent) -> bool {
        match self.readers.get(&ev.shard) {
            Some(h) if h.generation == ev.generation => {
                debug_assert_eq!(h.in_flight.current(), 0, "a stopped reader has nothing in flight");
                self.readers.remove(&ev.shard);
            }
            // A killed reader, already accounted for.
            _ => return false,
        }
        if ev.exit == ReaderExit::Killed && self.closing {
            self.killed_on_close.insert(ev.shard);
        }
        let revoked = self.d.membership.reader_stopped(ev.shard);
        if revoked {
            debug!(shard = %ev.shard, "shard drained; reporting it revoked");
        }
        self.publish();
        revoked
    }

    /// Kills the readers of `shards` and waits until they stopped (aborting stragglers).
    async fn kill_readers(&mut self, shards: &[ShardId]) {
        for shard in shards {
            if let Some(h) = self.readers.get(shard) {
                h.ctl.kill.cancel();
            }
        }
        // One grace period for all of them; while waiting, the lease of the readers that keep running is watched.
        let deadline = tokio::time::Instant::now() + KILL_GRACE;
        let mut others_killed = false;
        for shard in shards {
            let Some(mut h) = self.readers.remove(shard) else {
                continue;
            };
            loop {
                let lease_end = if others_killed { None } else { self.lease_watch() };
                tokio::select! {
                    biased;
                    r = tokio::time::timeout_at(deadline, &mut h.task) => {
                        if r.is_err() {
                            warn!(shard = %shard, "shard reader did not stop in time; aborting its task");
                            h.task.abort();
                        }
                        break;
                    }
                    _ = sleep_until_opt(lease_end) => {
                        // The lease ran out meanwhile: stop the others now; the main loop reports it (expiry).
                        for other in self.readers.values() {
                            other.ctl.kill.cancel();
                        }
                        others_killed = true;
                    }
                }
            }
            self.d.membership.reader_stopped(*shard);
        }
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
        self.record_gauges(&s, self.lease.remaining_at(Instant::now()));
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
    Instant::now() + PROMPT_DELAY
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
