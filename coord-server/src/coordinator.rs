//! The coordinator service: the public operations, each one or more critical sections over Redis-recorded
//! metadata (the crate's `section` module states their ordering contract).
//!
//! This module only wires: the critical section is written once (`section`), with one kind per hash
//! (`group_section`; `routing_section` for routing and group creation); every Redis command is in [`crate::store`];
//! the decisions are pure functions of [`crate::state_machine`] (the grace and suspected loss, recreate semantics,
//! the producer routing answer among them); per-group memory is `group_slots`.
//! What stays here: requests of one group queue on its local lock, and heartbeats that queue together run as one
//! section (group commit).

use protocol::messages::{
    CreateGroupRequest, GroupDescription, GroupList, GroupRef, HeartbeatRequest, HeartbeatResponse,
    RecreateGroupRequest, RoutingDescription, RoutingQuery, RoutingResponse,
};
use protocol::metadata::{GroupMetadata, GroupTimings, StreamRouting, MAX_SHARDS};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{Status, StoreRevision};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tracing::{info, warn, Instrument};

use crate::clock::LastRun;
use crate::config::Config;
use crate::error::{Error, StoreError};
use crate::group_section::{Decide, GroupEnv, GroupSection};
use crate::group_slots::{GroupSlot, Queued, Slots};
use crate::memory_policy::{self, PolicyCheck};
use crate::missing_metadata;
use crate::recent::{RecentEvent, RecentRebalances};
use crate::routing_section::{self, check_if_match, CreateSection, RoutingSection, RoutingStep};
use crate::section::{self, unavailable, Env};
use crate::shutdown::ShutdownGate;
use crate::spans;
use crate::state_machine::routing::Report;
use crate::state_machine::{self, Input, Liveness, Outcome, Transition};
use crate::stats::Stats;
use crate::store::{self, LivenessScope, Loaded, SectionKeys, Store};

pub use crate::group_slots::SLOT_RETENTION;

pub(crate) mod damaged_keys;
mod due;
mod quota;
mod reshard;
mod tick;
mod usage;

pub use quota::Usage;

/// How often the tick loop rebuilds the groups index by `SCAN`.
pub const INDEX_REBUILD_PERIOD: Duration = Duration::from_secs(10);

/// A coordinator instance: cheap to clone, shared by the HTTP handlers and the tick loop.
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field(
                "redis",
                &crate::config::redact_redis_target(&self.inner.config.redis_url),
            )
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: Config,
    store: Store,
    gate: ShutdownGate,
    stats: Stats,
    /// Per-group local lock, heartbeat queue and memory (see [`crate::group_slots`]).
    slots: Slots,
    /// Redis time (ms) before which nobody is expired, after a Redis restart (run id change).
    global_grace_until_ms: AtomicU64,
    /// The last Redis run id seen.
    run_id: StdMutex<Option<String>>,
    /// When the tick loop last rebuilt the groups index.
    index_rebuilt_at: StdMutex<LastRun>,
    /// The Redis `maxmemory-policy` precondition.
    eviction_policy: PolicyCheck,
    /// The last rebalance events this instance decided, for the status page.
    recent: RecentRebalances,
    /// Streams whose routing a consumer's report is being checked against (one check per stream at a time).
    routing_checks: StdMutex<std::collections::HashSet<StreamName>>,
    /// Per stream, the next shard whose record the tick's sweep looks at ([`Coordinator::tend_routing`]).
    record_sweep: StdMutex<std::collections::HashMap<StreamName, u32>>,
    /// The due index's safety sweep (see [`crate::due`]).
    sweep: StdMutex<crate::due::Sweep>,
    /// Until when every tick tends every stream's routing: one member TTL after a Redis restart or failover.
    tend_all_until: StdMutex<Option<tokio::time::Instant>>,
    /// Whether a tick tended every stream with a group since this process started (see
    /// `Coordinator::tends_every_routing`).
    tended_all_once: AtomicBool,
}

impl Coordinator {
    /// Connects to Redis, checks its version and commands, and returns a coordinator.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad configuration, [`StoreError`] when Redis is unreachable or unsupported.
    pub async fn connect(config: Config) -> Result<Coordinator, Error> {
        config.validate().map_err(Error::InvalidRequest)?;
        let store = Store::connect_split(
            &config.redis_url,
            config.metadata_redis_url.as_deref(),
            config.redis_tls.as_ref(),
        )
        .await?;
        tracing::info!(redis = %crate::config::redact_redis_target(&config.redis_url), cluster = store.nodes().is_some(),
            metadata_redis = ?config.metadata_redis_url.as_deref().map(crate::config::redact_redis_target),
            "connected to Redis");
        crate::startup::check_redis(&store)
            .await
            .inspect_err(crate::metrics::count_startup_failure)?;
        let run_id = store.run_id().await?;
        let eviction_policy = PolicyCheck::new(config.accept_eviction_policy);
        let coordinator = Coordinator {
            inner: Arc::new(Inner {
                config,
                store,
                gate: ShutdownGate::new(),
                stats: Stats::default(),
                slots: Slots::default(),
                global_grace_until_ms: AtomicU64::new(0),
                run_id: StdMutex::new(Some(run_id)),
                index_rebuilt_at: StdMutex::new(LastRun::default()),
                recent: RecentRebalances::default(),
                eviction_policy,
                routing_checks: StdMutex::new(Default::default()),
                record_sweep: StdMutex::new(Default::default()),
                sweep: StdMutex::new(Default::default()),
                tend_all_until: StdMutex::new(None),
                tended_all_once: AtomicBool::new(false),
            }),
        };
        coordinator.check_eviction_policy().await?;
        Ok(coordinator)
    }

    /// Reads Redis's `maxmemory-policy` (through `INFO memory`), records it in the metrics and logs an error
    /// while it is not `noeviction`. Returns whether this instance may report ready: the policy is `noeviction`
    /// or accepted by configuration.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn check_eviction_policy(&self) -> Result<bool, Error> {
        let policy = memory_policy::read(&self.inner.store).await?;
        let check = &self.inner.eviction_policy;
        let safe = check.record(&policy);
        self.inner.stats.metrics().eviction_policy(!safe);
        Ok(safe || check.accepted())
    }

    /// The `maxmemory-policy` precondition's last result.
    pub fn eviction_policy(&self) -> &PolicyCheck {
        &self.inner.eviction_policy
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The shutdown gate.
    pub fn gate(&self) -> &ShutdownGate {
        &self.inner.gate
    }

    /// Counters of what happened.
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Renders `GET /metrics`: the lag (scraped at most once per [`crate::metrics::LAG_MIN_REFRESH`]), the
    /// counters and the instance state, in the Prometheus text format.
    pub async fn render_metrics(&self) -> String {
        let (stats, gate) = (&self.inner.stats, &self.inner.gate);
        self.tenant_usage().await;
        stats
            .metrics()
            .render(
                &self.inner.store,
                stats.totals(),
                gate.is_terminating(),
                gate.in_flight(),
            )
            .await
    }

    /// Handles a consumer heartbeat (join, heartbeat or leave), without a member quota (see
    /// [`Coordinator::heartbeat_within`]).
    ///
    /// # Errors
    /// [`Error::Rejected`] for fenced, unknown or invalid members; see [`Error`] for the rest.
    pub async fn heartbeat(
        &self,
        stream: &StreamName,
        group: &GroupName,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, Error> {
        self.heartbeat_within(stream, group, req, None).await
    }

    /// A consumer saw a routing above the one its group adopted: the group may only be behind (its next tick
    /// adopts), or Redis lost part of the routing. Checked in the background against the stored routing, one
    /// check per stream at a time: a report above it prompts a probe of Redis, and only what Redis holds restores
    /// anything (see `state_machine::routing`).
    fn check_routing_report(&self, stream: &StreamName, version: protocol::RoutingVersion, shard_count: u32) {
        {
            let mut checks = self.inner.routing_checks.lock().expect("routing checks lock");
            if !checks.insert(stream.clone()) {
                return;
            }
        }
        let this = self.clone();
        let stream = stream.clone();
        tokio::spawn(async move {
            let report = Report { version, shard_count };
            let result = async {
                let (_, stored) = this.read_routing(&stream).await?;
                if report.version > stored.routing_version || report.shard_count > stored.shard_count {
                    this.restore_routing(&stream, Some(report)).await?;
                }
                Ok::<_, Error>(())
            }
            .await;
            if let Err(e) = result {
                warn!(stream = %stream, error = %e, "checking a consumer's routing report failed");
            }
            this.inner.stats.routing_report_checks.fetch_add(1, Ordering::Relaxed);
            this.inner
                .routing_checks
                .lock()
                .expect("routing checks lock")
                .remove(&stream);
        });
    }

    /// Runs queued heartbeats as one critical section and answers each.
    async fn heartbeat_batch(&self, stream: &StreamName, group: &GroupName, slot: &GroupSlot, batch: Vec<Queued>) {
        let reqs: Vec<state_machine::Admission<'_>> = batch.iter().map(Queued::admission).collect();
        let members: Vec<&MemberId> = reqs.iter().map(|r| &r.req.member_id).collect();
        let mut outcomes = Vec::new();
        let result = self
            .group_section_locked(
                stream,
                group,
                slot,
                LivenessScope::Members(&members),
                |meta, live, clock, _| {
                    let (t, o) = state_machine::apply_heartbeats_within(meta, live, &reqs, clock);
                    outcomes = o;
                    Ok(t)
                },
            )
            .await;
        self.inner.stats.observe_batch(batch.len());
        match result {
            Ok(_) => {
                for (q, outcome) in batch.into_iter().zip(outcomes) {
                    self.inner.stats.heartbeat(&outcome);
                    let answer = match outcome {
                        Outcome::Heartbeat(r) => Ok(r),
                        Outcome::Rejected(r) => Err(Error::Rejected {
                            status: r.status,
                            message: r.message,
                            member_epoch: r.member_epoch,
                        }),
                        Outcome::Done => Err(StoreError::Protocol("heartbeat produced no answer".into()).into()),
                    };
                    let _ = q.reply.send(answer);
                }
            }
            Err(e) => {
                for q in batch {
                    let _ = q.reply.send(Err(e.duplicate()));
                }
            }
        }
    }

    /// Fences a member now (admin). Its shards move when its lease ends.
    ///
    /// # Errors
    /// [`Error::RevisionConflict`] when `if_match` is stale; [`Error::Rejected`] for an unknown member.
    pub async fn fence_member(
        &self,
        stream: &StreamName,
        group: &GroupName,
        member: &MemberId,
        if_match: Option<StoreRevision>,
    ) -> Result<GroupDescription, Error> {
        let (t, _) = self
            .group_section(stream, group, LivenessScope::All, |meta, live, clock, rev| {
                check_if_match(if_match, rev)?;
                Ok(state_machine::apply(meta, live, Input::FenceMember(member), clock))
            })
            .instrument(spans::section("fence", stream, Some(group)))
            .await?;
        if let Outcome::Rejected(r) = t.outcome {
            return Err(Error::Rejected {
                status: r.status,
                message: r.message,
                member_epoch: None,
            });
        }
        self.describe_group(stream, group).await
    }

    /// The admin view of a group, read without the mutex (a snapshot at one revision).
    ///
    /// # Errors
    /// [`Error::MetadataUnavailable`] when the group is missing or unreadable.
    pub async fn describe_group(&self, stream: &StreamName, group: &GroupName) -> Result<GroupDescription, Error> {
        let keys = SectionKeys::group(stream, group);
        let loaded = self
            .inner
            .store
            .read(&keys, true)
            .await
            .map_err(|e| section::store_error(&self.inner.stats, e))?;
        let Some(rev) = loaded.revision else {
            return Err(self.absent_group(stream, group).await);
        };
        let (meta, _) = store::decode_group(&loaded, None).map_err(|e| unavailable(&self.inner.stats, e))?;
        let liveness: Liveness = loaded.liveness.iter().cloned().collect();
        Ok(state_machine::describe(&meta, &liveness, rev, loaded.now_ms))
    }

    /// Creates a group, and its stream's routing when the stream has none.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] when the group exists (or the index says it existed: use recreate);
    /// [`Error::InvalidRequest`] for bad shard counts or timings.
    pub async fn create_group(
        &self,
        stream: &StreamName,
        group: &GroupName,
        req: &CreateGroupRequest,
    ) -> Result<GroupDescription, Error> {
        let timings = self.creatable_timings(req.timings)?;
        let indexed = self.inner.store.indexed_groups().await?;
        if indexed.contains(&protocol::keys::groups_index_member(stream, group)) {
            let exists = self.group_exists(stream, group).await?;
            let msg = if exists {
                format!("group {group} of stream {stream} exists")
            } else {
                format!("group {group} of stream {stream} existed and its metadata is lost: use recreate")
            };
            return Err(Error::AlreadyExists(msg));
        }
        self.insert_group(stream, group, req.shard_count, timings, false).await
    }

    /// Recreates a group whose metadata was lost (explicit operator action). The new group starts with an open
    /// correction round, so no shard is handed out before one member TTL has passed (clients of the lost group
    /// may still hold leases), and at a metadata version (Redis time in ms) above any version of the lost group
    /// (see [`state_machine::recreate`]).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] without `confirm`; [`Error::AlreadyExists`] while metadata exists.
    pub async fn recreate_group(
        &self,
        stream: &StreamName,
        group: &GroupName,
        req: &RecreateGroupRequest,
    ) -> Result<GroupDescription, Error> {
        if !req.confirm {
            return Err(Error::InvalidRequest("recreate requires \"confirm\": true".into()));
        }
        let timings = self.creatable_timings(req.timings)?;
        if self.group_exists(stream, group).await? {
            return Err(Error::AlreadyExists(format!(
                "group {group} of stream {stream} has metadata; not recreating"
            )));
        }
        self.insert_group(stream, group, Some(req.shard_count), timings, true)
            .await
    }

    /// The routing a producer should use. `SYNC_METADATA` when the producer has seen a newer routing than Redis
    /// stores (a lost write): it must adopt this older one (see [`state_machine::routing`]).
    ///
    /// # Errors
    /// [`Error::MetadataUnavailable`] when the stream has no routing or it is unreadable.
    pub async fn routing(&self, stream: &StreamName, query: RoutingQuery) -> Result<RoutingResponse, Error> {
        let (_, mut r) = self.read_routing(stream).await?;
        let report = Report {
            version: query.max_observed_version.max(query.routing_version),
            shard_count: query.max_shard_count,
        };
        if report.version > r.routing_version || report.shard_count > r.shard_count {
            // The producer saw more than Redis stores: restore before answering, so it never adopts a routing
            // that lost a growth it wrote by (see `state_machine::routing`).
            match self.restore_routing(stream, Some(report)).await {
                Ok(restored) => r = restored,
                // Another section holds the routing (a large growth being sealed): answer what is stored. A
                // believed report is sent again by the producer's next refresh (it keeps what it saw), and a
                // fenced producer cannot write by a layout a shard does not know meanwhile.
                Err(Error::Store(crate::error::StoreError::MutexBusy { .. })) => {}
                Err(e) => return Err(e),
            }
        }
        let answer = state_machine::routing::answer(&r, &query);
        if answer.status == Status::SyncMetadata {
            self.inner.stats.routing_regressions.fetch_add(1, Ordering::Relaxed);
            warn!(stream = %stream, reported = %query.max_observed_version, stored = %r.routing_version,
                "producer reported a routing version above the stored one");
        }
        Ok(answer)
    }

    /// The admin view of a stream's routing.
    ///
    /// # Errors
    /// [`Error::MetadataUnavailable`] when the stream has no routing.
    pub async fn describe_routing(&self, stream: &StreamName) -> Result<RoutingDescription, Error> {
        let (rev, r) = self.read_routing(stream).await?;
        let probed =
            routing_section::probe(&self.inner.store, stream, r.shard_count, self.growth_ceiling(stream)).await?;
        Ok(routing_description(&r, rev, Some(&probed)))
    }

    /// Lists groups from the rebuildable index, rebuilding it by `SCAN` first when asked.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn list_groups(&self, rebuild: bool) -> Result<GroupList, Error> {
        let raw = if rebuild {
            self.inner.store.rebuild_index().await?
        } else {
            self.inner.store.indexed_groups().await?
        };
        Ok(GroupList {
            groups: store::group_refs(&raw),
        })
    }

    /// The groups the tick loop's safety sweep visits (see [`crate::due`]; the due index decides the others):
    /// [`Coordinator::sweep_groups`], which survives a damaged groups index.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn groups_to_tick(&self) -> Result<Vec<GroupRef>, Error> {
        self.sweep_groups().await
    }

    /// Checks Redis's run id; a change (a restart that may have lost liveness) starts a global grace period.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn check_redis_restart(&self) -> Result<bool, Error> {
        let run_id = self.inner.store.run_id().await?;
        let changed = {
            let mut last = self.inner.run_id.lock().expect("run id lock");
            let changed = last.as_deref().is_some_and(|l| l != run_id);
            *last = Some(run_id);
            changed
        };
        if changed {
            let now = self.inner.store.time_ms().await?;
            let grace = now + self.max_ttl_ms();
            self.inner.global_grace_until_ms.fetch_max(grace, Ordering::AcqRel);
            self.inner.stats.redis_restarts.fetch_add(1, Ordering::Relaxed);
            warn!("Redis run id changed: no member expires for one member TTL");
        }
        Ok(changed)
    }

    fn max_ttl_ms(&self) -> u64 {
        // Groups may have longer TTLs than the default; a global grace must cover the longest one we know.
        self.inner
            .slots
            .max_ttl_ms()
            .unwrap_or(0)
            .max(self.inner.config.default_timings.member_ttl_ms)
    }

    /// Forgets every slot nobody uses whose group no load found within [`SLOT_RETENTION`] (never found, deleted,
    /// or idle). Returns how many slots remain. Run by the tick loop.
    pub fn evict_idle_slots(&self) -> usize {
        self.inner.slots.evict_idle()
    }

    /// Drops the least recently used cached aggregates beyond [`Config::max_cached_aggregates`] (they are read
    /// from Redis again on their next use). Returns how many were dropped. Run by the tick loop.
    pub fn trim_cached_aggregates(&self) -> usize {
        self.inner
            .slots
            .trim_aggregates(self.inner.config.max_cached_aggregates)
    }

    /// How many decoded aggregates this process caches.
    pub fn cached_aggregates(&self) -> usize {
        self.inner.slots.cached_aggregates()
    }

    /// How many per-group slots this process holds.
    pub fn slot_count(&self) -> usize {
        self.inner.slots.len()
    }

    /// The last rebalance events this instance decided (membership, ownership, correction rounds), newest first.
    /// Memory only, per instance: see [`crate::recent`].
    pub fn recent_rebalances(&self) -> Vec<RecentEvent> {
        self.inner.recent.newest_first()
    }

    /// Refuses group creation while Redis may evict the keys it would write (see [`crate::memory_policy`]).
    fn require_safe_eviction_policy(&self) -> Result<(), Error> {
        self.inner
            .eviction_policy
            .require_safe()
            .map_err(|e| StoreError::Unsupported(e).into())
    }

    async fn absent_group(&self, stream: &StreamName, group: &GroupName) -> Error {
        let inner = &self.inner;
        missing_metadata::group(&inner.store, &inner.stats, &inner.slots, stream, group).await
    }

    fn env(&self) -> Env<'_> {
        let inner = &self.inner;
        Env {
            store: &inner.store,
            gate: &inner.gate,
            stats: &inner.stats,
            mutex_ttl: inner.config.mutex_ttl,
            deadline: inner.config.critical_section_timeout,
        }
    }

    /// The critical section of a group: `f` decides on the loaded metadata, and may refuse with an error after
    /// seeing the loaded revision (admin `If-Match`); nothing is written then.
    async fn group_section(
        &self,
        stream: &StreamName,
        group: &GroupName,
        scope: LivenessScope<'_>,
        f: impl Decide,
    ) -> Result<(Transition, StoreRevision), Error> {
        let slot = self.inner.slots.slot(stream, group);
        let local = slot.lock.lock().await;
        let result = self.group_section_locked(stream, group, &slot, scope, f).await;
        drop(local);
        self.inner.slots.forget_if_absent(stream, group, slot);
        result
    }

    /// [`Self::group_section`] for a caller that already holds the group's local lock.
    async fn group_section_locked(
        &self,
        stream: &StreamName,
        group: &GroupName,
        slot: &GroupSlot,
        scope: LivenessScope<'_>,
        f: impl Decide,
    ) -> Result<(Transition, StoreRevision), Error> {
        let inner = &self.inner;
        let env = GroupEnv {
            store: &inner.store,
            stats: &inner.stats,
            slots: &inner.slots,
            recent: &inner.recent,
            global_grace_until_ms: &inner.global_grace_until_ms,
        };
        // The due time of what the decision leaves, computed only when the aggregate changes: a commit that only
        // renews leases makes no deadline earlier, and writes no score (see `crate::due`).
        let mut f = f;
        let mut next_due = None;
        let scoring = |meta: &GroupMetadata, live: &Liveness, clock: state_machine::Clock, rev: StoreRevision| {
            let t = f(meta, live, clock, rev)?;
            next_due = t.next.is_some().then(|| due::due_after(meta, live, &t, clock));
            Ok(t)
        };
        let mut section = GroupSection {
            env,
            stream,
            group,
            slot,
            scope,
            f: scoring,
            attempt: Default::default(),
        };
        let (t, revision) = section::run(self.env(), &SectionKeys::group(stream, group), &mut section).await?;
        if let Some(due) = next_due.filter(|_| t.next.is_some()) {
            let g = GroupRef {
                stream: stream.clone(),
                group: group.clone(),
            };
            self.record_due(&[(g, due::Scored { due, revision })], &[]).await;
        }
        Ok((t, revision))
    }

    /// A critical section over a stream's routing, deciding with `f`.
    async fn routing_section<F>(&self, stream: &StreamName, mut f: F) -> Result<(StreamRouting, StoreRevision), Error>
    where
        F: FnMut(&Loaded) -> Result<RoutingStep, Error>,
    {
        let mut section = RoutingSection::new(|loaded: &Loaded, _: &routing_section::Probed| f(loaded));
        section::run(self.env(), &SectionKeys::routing(stream), &mut section).await
    }

    /// A critical section over a stream's routing that reads the shards' evidence first (their records beyond the
    /// routing, shard 0's fence), deciding with `f`.
    pub(crate) async fn probing_routing_section<F>(
        &self,
        stream: &StreamName,
        f: F,
    ) -> Result<(StreamRouting, StoreRevision), Error>
    where
        F: FnMut(&Loaded, &routing_section::Probed) -> Result<RoutingStep, Error>,
    {
        let mut section = RoutingSection::new(f).probing(stream, self.growth_ceiling(stream));
        section::run(self.env(), &SectionKeys::routing(stream), &mut section).await
    }

    /// The most shards `stream` may be grown or restored to (see [`crate::quota::principals::Principals::growth_ceiling`]).
    pub(crate) fn growth_ceiling(&self, stream: &StreamName) -> u32 {
        let config = &self.inner.config;
        // `Config::validate` built these once already; a table it refused never reaches a coordinator.
        crate::quota::principals::Principals::new(config).map_or(config.quota.shards_per_group, |p| {
            p.growth_ceiling(config.credentials(), &config.quota, stream.as_str())
        })
    }

    async fn read_routing(&self, stream: &StreamName) -> Result<(StoreRevision, StreamRouting), Error> {
        let inner = &self.inner;
        let routing = inner
            .store
            .read_routing(stream)
            .await
            .map_err(|e| section::store_error(&inner.stats, e))?;
        let Some((rev, json)) = routing else {
            return Err(missing_metadata::stream(&inner.store, &inner.stats, &inner.slots, stream).await);
        };
        let r = store::decode_routing(&json).map_err(|e| unavailable(&inner.stats, e))?;
        Ok((rev, r))
    }

    /// The stream's routing, created with `shard_count` when missing; an existing one must match it.
    async fn ensure_routing(&self, stream: &StreamName, shard_count: Option<u32>) -> Result<StreamRouting, Error> {
        if let Some(n) = shard_count {
            if n == 0 || n > MAX_SHARDS {
                return Err(Error::InvalidRequest(format!("shardCount must be 1 to {MAX_SHARDS}")));
            }
        }
        let lease_ms = self.inner.config.routing_lease.as_millis() as u64;
        let stats = &self.inner.stats;
        let (routing, _) = self
            .routing_section(stream, |loaded| {
                routing_section::ensure(stats, loaded, stream, shard_count, lease_ms)
            })
            .await?;
        Ok(routing)
    }

    /// The timings a new group gets, checked, once Redis may not evict what creation writes.
    fn creatable_timings(&self, timings: Option<GroupTimings>) -> Result<GroupTimings, Error> {
        let timings = timings.unwrap_or(self.inner.config.default_timings);
        self.inner
            .config
            .check_timings(&timings)
            .map_err(Error::InvalidRequest)?;
        self.require_safe_eviction_policy()?;
        Ok(timings)
    }

    /// Creates (or recreates) a group, and its stream's routing when the stream has none.
    async fn insert_group(
        &self,
        stream: &StreamName,
        group: &GroupName,
        shard_count: Option<u32>,
        timings: GroupTimings,
        recreate: bool,
    ) -> Result<GroupDescription, Error> {
        let span = spans::section(if recreate { "recreate" } else { "create" }, stream, Some(group));
        let routing = self
            .ensure_routing(stream, shard_count)
            .instrument(span.clone())
            .await?;
        self.write_group(stream, group, &routing, timings, recreate)
            .instrument(span)
            .await
    }

    /// Writes a new group's metadata hash (never over one that exists in any form) and indexes it.
    async fn write_group(
        &self,
        stream: &StreamName,
        group: &GroupName,
        routing: &StreamRouting,
        timings: GroupTimings,
        recreate: bool,
    ) -> Result<GroupDescription, Error> {
        let make = |now_ms| {
            let meta = state_machine::create_group(stream.clone(), group.clone(), routing, timings, now_ms);
            if recreate {
                state_machine::recreate::recreated(meta, now_ms)
            } else {
                meta
            }
        };
        let keys = SectionKeys::group(stream, group);
        let mut section = CreateSection::new(stream, group, make);
        section::run(self.env(), &keys, &mut section).await?;
        self.inner.store.index_group(stream, group).await?;
        self.make_due(stream, group).await;
        info!(stream = %stream, group = %group, recreate, "group created");
        self.describe_group(stream, group).await
    }

    async fn group_exists(&self, stream: &StreamName, group: &GroupName) -> Result<bool, Error> {
        Ok(self.inner.store.hash_exists(&SectionKeys::group(stream, group)).await?)
    }
}

#[cfg(feature = "fault-injection")]
impl crate::fault::Target for Coordinator {
    fn instance_stats(&self) -> &Stats {
        &self.inner.stats
    }
}

fn routing_description(
    r: &StreamRouting,
    revision: StoreRevision,
    probed: Option<&routing_section::Probed>,
) -> RoutingDescription {
    RoutingDescription {
        stream: r.stream.clone(),
        revision,
        routing_version: r.routing_version,
        shard_count: r.shard_count,
        routing_lease_ms: r.routing_lease_ms,
        shard_records: r.shard_records,
        shards_beyond_routing: probed.map_or(0, |p| p.beyond.len() as u32),
        fence_above_routing: probed.map(|p| p.fence).filter(|f| *f > r.routing_version),
    }
}
