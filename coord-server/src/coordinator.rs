//! The coordinator service: every operation as a critical section over Redis-recorded metadata.
//!
//! # Ordering contract
//! For every mutation:
//! 1. take the group's local lock (requests for one group queue here instead of spinning on Redis);
//! 2. pass the shutdown gate (refused with `COORDINATOR_TERMINATING` once shutdown began);
//! 3. take the group's Redis mutex and load (one script);
//! 4. run the pure state machine with Redis `TIME`;
//! 5. write with the revision compare-and-set (one script, which also releases the mutex);
//! 6. answer from what was written. A conflict goes back to step 3; nothing is answered from an unwritten state.

use protocol::messages::{
    CreateGroupRequest, GroupDescription, GroupList, GroupRef, HeartbeatRequest, HeartbeatResponse,
    RecreateGroupRequest, RoutingDescription, RoutingQuery, RoutingResponse,
};
use protocol::metadata::{GroupMetadata, GroupTimings, StreamRouting, MAX_SHARDS};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{MetadataVersion, Status, StoreRevision};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tracing::{debug, info, warn, Instrument};

use crate::config::Config;
use crate::error::{Error, StoreError};
use crate::memory_policy::{self, PolicyCheck};
use crate::recent::{RecentEvent, RecentRebalances};
use crate::shutdown::ShutdownGate;
use crate::spans::{self, Boundary};
use crate::state_machine::{self, Clock, Event, Input, Liveness, Outcome, Transition};
use crate::stats::Stats;
use crate::store::{self, Cached, Committed, LivenessScope, Loaded, SectionKeys, Store, Write};
use crate::traces::{self, Absence};

mod reshard;

/// How often the tick loop rebuilds the groups index by `SCAN`.
pub const INDEX_REBUILD_PERIOD: Duration = Duration::from_secs(10);

/// How long a slot is kept after the last load that found its group: a group that stays deleted (and unindexed)
/// is ticked that long, with this process's memory of its versions, then forgotten.
pub const SLOT_RETENTION: Duration = Duration::from_secs(300);

/// How many times a critical section reloads after losing a compare-and-set.
const MAX_CAS_ATTEMPTS: usize = 5;

/// A coordinator instance: cheap to clone, shared by the HTTP handlers and the tick loop.
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("redis", &protocol::redact::redact_url(&self.inner.config.redis_url))
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: Config,
    store: Store,
    gate: ShutdownGate,
    stats: Stats,
    /// Per-group local lock and cache of the last aggregate read or written (keyed by revision). A slot exists
    /// while a request or tick uses it, and afterwards only for a group some load found (see [`SLOT_RETENTION`]):
    /// requests naming groups that do not exist leave nothing here and add no tick work.
    groups: StdMutex<HashMap<(StreamName, GroupName), Arc<GroupSlot>>>,
    /// Redis time (ms) before which nobody is expired, after a Redis restart (run id change).
    global_grace_until_ms: AtomicU64,
    /// The last Redis run id seen.
    run_id: StdMutex<Option<String>>,
    /// When the tick loop last rebuilt the groups index.
    index_rebuilt_at: StdMutex<Option<Instant>>,
    /// The Redis `maxmemory-policy` precondition.
    eviction_policy: PolicyCheck,
    /// The last rebalance events this instance decided, for the status page.
    recent: RecentRebalances,
}

#[derive(Default)]
struct GroupSlot {
    /// The "local monitor": one critical section per group at a time in this process.
    lock: tokio::sync::Mutex<()>,
    /// Heartbeats waiting for the next critical section of the group (group commit).
    queue: StdMutex<Vec<Queued>>,
    cache: StdMutex<GroupMemory>,
    /// When a load last found the group's metadata hash; `None`: never (the group may not exist).
    present_at: StdMutex<Option<Instant>>,
}

impl GroupSlot {
    fn present_at(&self) -> Option<Instant> {
        *self.present_at.lock().expect("slot lock")
    }

    fn mark_present(&self) {
        *self.present_at.lock().expect("slot lock") = Some(Instant::now());
    }

    /// Whether this slot is worth keeping when nobody uses it: its group was found recently.
    fn retained(&self) -> bool {
        self.present_at().is_some_and(|t| t.elapsed() < SLOT_RETENTION)
    }
}

/// A heartbeat waiting in a group's queue, with the channel its answer goes back on.
struct Queued {
    req: HeartbeatRequest,
    reply: oneshot::Sender<Result<HeartbeatResponse, Error>>,
}

/// Most heartbeats run in one critical section: bounds the section's time and the COMMIT script's size.
const MAX_HEARTBEAT_BATCH: usize = 256;

/// What this process remembers about a group between critical sections.
#[derive(Clone, Default)]
struct GroupMemory {
    /// The decoded aggregate at a revision: a load at the same revision skips fetching and parsing it.
    aggregate: Option<(StoreRevision, Arc<GroupMetadata>)>,
    /// [`store::digest`] and length of that aggregate's JSON: a load skips it only while the stored one matches.
    digest: String,
    len: usize,
    /// Highest metadata version this process has seen for the group (to notice a regression itself).
    highest: MetadataVersion,
    /// No expiry before this Redis time: first sight of the group by this process, or a seen regression.
    /// `None` until the first load.
    grace_until_ms: Option<u64>,
}

impl Coordinator {
    /// Connects to Redis, checks its version and commands, and returns a coordinator.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad configuration, [`StoreError`] when Redis is unreachable or unsupported.
    pub async fn connect(config: Config) -> Result<Coordinator, Error> {
        config.validate().map_err(Error::InvalidRequest)?;
        let client = redis::Client::open(config.redis_url.as_str()).map_err(StoreError::from)?;
        let conn = redis::aio::ConnectionManager::new(client)
            .await
            .map_err(StoreError::from)?;
        let store = Store::new(conn);
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
                groups: StdMutex::new(HashMap::new()),
                global_grace_until_ms: AtomicU64::new(0),
                run_id: StdMutex::new(Some(run_id)),
                index_rebuilt_at: StdMutex::new(None),
                recent: RecentRebalances::default(),
                eviction_policy,
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

    /// Handles a consumer heartbeat (join, heartbeat or leave).
    ///
    /// # Errors
    /// [`Error::Rejected`] for fenced, unknown or invalid members; see [`Error`] for the rest.
    pub async fn heartbeat(
        &self,
        stream: &StreamName,
        group: &GroupName,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, Error> {
        // Group commit: heartbeats of one group that arrive while a critical section runs wait in the group's
        // queue; whoever takes the local lock next runs all of them in one section (one LOAD, one COMMIT), so a
        // large group costs two round trips per batch rather than per member.
        let slot = self.slot(stream, group);
        let result = self.heartbeat_in(stream, group, &slot, req).await;
        self.forget_if_absent(stream, group, slot);
        result
    }

    /// [`Self::heartbeat`] through the group's queue.
    async fn heartbeat_in(
        &self,
        stream: &StreamName,
        group: &GroupName,
        slot: &GroupSlot,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, Error> {
        let (reply, mut answer) = oneshot::channel();
        slot.queue.lock().expect("queue lock").push(Queued {
            req: req.clone(),
            reply,
        });
        loop {
            let local = slot.lock.lock().await;
            match answer.try_recv() {
                Ok(result) => return result,
                Err(oneshot::error::TryRecvError::Closed) => {
                    // The section that took our request was cancelled before answering. A heartbeat is
                    // idempotent: queue it again.
                    let (reply, again) = oneshot::channel();
                    slot.queue.lock().expect("queue lock").push(Queued {
                        req: req.clone(),
                        reply,
                    });
                    answer = again;
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let batch: Vec<Queued> = {
                let mut queue = slot.queue.lock().expect("queue lock");
                let n = queue.len().min(MAX_HEARTBEAT_BATCH);
                queue.drain(..n).collect()
            };
            if !batch.is_empty() {
                self.heartbeat_batch(stream, group, batch)
                    .instrument(spans::heartbeat(stream, group, &req.member_id, req.member_epoch))
                    .await;
            }
            drop(local);
            if let Ok(result) = answer.try_recv() {
                return result;
            }
        }
    }

    /// Runs queued heartbeats as one critical section and answers each.
    async fn heartbeat_batch(&self, stream: &StreamName, group: &GroupName, batch: Vec<Queued>) {
        let reqs: Vec<&HeartbeatRequest> = batch.iter().map(|q| &q.req).collect();
        let members: Vec<&MemberId> = reqs.iter().map(|r| &r.member_id).collect();
        let mut outcomes = Vec::new();
        let result = self
            .group_section_locked(
                stream,
                group,
                LivenessScope::Members(&members),
                |meta, live, clock, _| {
                    let (t, o) = state_machine::apply_heartbeats(meta, live, &reqs, clock);
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

    /// Runs one tick of a group: expiry, fencing, hold ends, routing adoption, closing a correction round.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn tick_group(&self, stream: &StreamName, group: &GroupName) -> Result<(), Error> {
        let routing = match self.inner.store.read_routing(stream).await {
            Ok(Some((_, json))) => match store::decode_routing(&json) {
                Ok(r) => Some(r),
                Err(e) => {
                    warn!(stream = %stream, error = %e, "routing unreadable; not adopting");
                    None
                }
            },
            Ok(None) => None,
            // A damaged routing hash must not stop the group's expiry: tick it without adopting.
            Err(StoreError::Corrupt(e)) => {
                warn!(stream = %stream, error = %e, "routing unreadable; not adopting");
                None
            }
            Err(e) => return Err(e.into()),
        };
        // Resharding: seal what a growth left unsealed before the group adopts it (see `reshard`).
        let routing = match routing {
            Some(r) => Some(self.seal_growths(stream, &r).await.unwrap_or_else(|e| {
                warn!(stream = %stream, error = %e, "sealing parents failed; retried next tick");
                r
            })),
            None => None,
        };
        let mut needs = Vec::new();
        self.group_section(stream, group, LivenessScope::All, |meta, live, clock, _| {
            self.inner.stats.metrics().observe_group(meta, live, clock.now_ms);
            let t = state_machine::apply(
                meta,
                live,
                Input::Tick {
                    routing: routing.as_ref(),
                },
                clock,
            );
            needs = state_machine::reshard::needs(t.next.as_ref().unwrap_or(meta));
            Ok(t)
        })
        .instrument(spans::section("tick", stream, Some(group)))
        .await?;
        // The tick's own work is recorded; what the reshard observation could not read is looked at next tick.
        if let Err(e) = self.observe_reshards(stream, group, needs).await {
            warn!(stream = %stream, group = %group, error = %e, "reshard observation failed; retried next tick");
        }
        Ok(())
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
            .map_err(|e| self.store_error(e))?;
        let (Some(rev), Some(agg)) = (loaded.revision, loaded.aggregate.as_deref()) else {
            return Err(self.absent_group(stream, group).await);
        };
        let meta = store::decode_group(&loaded, agg).map_err(|e| self.unavailable(e))?;
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
        let timings = req.timings.unwrap_or(self.inner.config.default_timings);
        self.inner
            .config
            .check_timings(&timings)
            .map_err(Error::InvalidRequest)?;
        self.require_safe_eviction_policy()?;
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
        let span = spans::section("create", stream, Some(group));
        let routing = self
            .ensure_routing(stream, req.shard_count)
            .instrument(span.clone())
            .await?;
        self.insert_group(stream, group, &routing, timings, false)
            .instrument(span)
            .await
    }

    /// Recreates a group whose metadata was lost (explicit operator action). The new group starts with an open
    /// correction round, so no shard is handed out before one member TTL has passed (clients of the lost group
    /// may still hold leases), and at a metadata version (Redis time in ms) above any version of the lost group.
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
        let timings = req.timings.unwrap_or(self.inner.config.default_timings);
        self.inner
            .config
            .check_timings(&timings)
            .map_err(Error::InvalidRequest)?;
        self.require_safe_eviction_policy()?;
        if self.group_exists(stream, group).await? {
            return Err(Error::AlreadyExists(format!(
                "group {group} of stream {stream} has metadata; not recreating"
            )));
        }
        let span = spans::section("recreate", stream, Some(group));
        let routing = self
            .ensure_routing(stream, Some(req.shard_count))
            .instrument(span.clone())
            .await?;
        self.insert_group(stream, group, &routing, timings, true)
            .instrument(span)
            .await
    }

    /// Grows a stream by `count` shards and seals every old shard (the parents, see `docs/resharding.md`).
    /// Groups adopt the new routing on their next tick and read the new shards once they drained the parents.
    ///
    /// # Errors
    /// [`Error::RevisionConflict`] when `if_match` is stale; [`Error::MetadataUnavailable`] when the stream has
    /// no routing.
    pub async fn add_shards(
        &self,
        stream: &StreamName,
        count: u32,
        if_match: Option<StoreRevision>,
    ) -> Result<RoutingDescription, Error> {
        // Checked before If-Match and the stored count, so an impossible count is refused as such whatever is stored.
        if count == 0 || count >= MAX_SHARDS {
            return Err(Error::InvalidRequest(format!("count must be 1 to {}", MAX_SHARDS - 1)));
        }
        let keys = SectionKeys::routing(stream);
        let (routing, rev) = self
            .plain_section(&keys, |loaded| {
                let Some(rev) = loaded.revision else {
                    return Err(Error::MetadataUnavailable(format!("stream {stream} has no routing")));
                };
                check_if_match(if_match, rev)?;
                let current = self.decode_loaded_routing(loaded)?;
                if current.shard_count.saturating_add(count) > MAX_SHARDS {
                    return Err(Error::InvalidRequest(format!(
                        "a stream has at most {MAX_SHARDS} shards"
                    )));
                }
                Ok(Some(state_machine::add_shards(&current, count)))
            })
            .instrument(spans::section("add_shards", stream, None))
            .await?;
        let routing = routing.expect("add_shards always writes");
        info!(stream = %stream, shard_count = routing.shard_count, routing_version = %routing.routing_version, "shards added");
        // Seal the parents now; what fails here the tick finishes (the growth is recorded as unsealed).
        if let Err(e) = self.seal_growths(stream, &routing).await {
            warn!(stream = %stream, error = %e, "sealing parents failed; the tick retries");
        }
        Ok(routing_description(&routing, rev))
    }

    /// The routing a producer should use. `SYNC_METADATA` when the producer has seen a newer routing than Redis
    /// stores (a lost write): it must adopt this older one.
    ///
    /// # Errors
    /// [`Error::MetadataUnavailable`] when the stream has no routing or it is unreadable.
    pub async fn routing(&self, stream: &StreamName, query: RoutingQuery) -> Result<RoutingResponse, Error> {
        let (_, r) = self.read_routing(stream).await?;
        let regressed = query.max_observed_version > r.routing_version || query.routing_version > r.routing_version;
        if regressed {
            self.inner.stats.routing_regressions.fetch_add(1, Ordering::Relaxed);
            warn!(stream = %stream, reported = %query.max_observed_version, stored = %r.routing_version,
                "producer reported a routing version above the stored one");
        }
        Ok(RoutingResponse {
            status: if regressed { Status::SyncMetadata } else { Status::Ok },
            stream: stream.clone(),
            routing_version: r.routing_version,
            shard_count: r.shard_count,
            routing_lease_ms: r.routing_lease_ms,
            refresh_interval_ms: (r.routing_lease_ms / 3).max(1),
        })
    }

    /// The admin view of a stream's routing.
    ///
    /// # Errors
    /// [`Error::MetadataUnavailable`] when the stream has no routing.
    pub async fn describe_routing(&self, stream: &StreamName) -> Result<RoutingDescription, Error> {
        let (rev, r) = self.read_routing(stream).await?;
        Ok(routing_description(&r, rev))
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
        let mut groups: Vec<GroupRef> = raw
            .iter()
            .filter_map(|s| {
                let (stream, group) = s.split_once(':')?;
                Some(GroupRef {
                    stream: StreamName::new(stream).ok()?,
                    group: GroupName::new(group).ok()?,
                })
            })
            .collect();
        groups.sort();
        Ok(GroupList { groups })
    }

    /// The groups the tick loop visits: the index, rebuilt by `SCAN` at most every [`INDEX_REBUILD_PERIOD`] (a lost
    /// or incomplete index must not stop expiry), plus every group a load of this process found within
    /// [`SLOT_RETENTION`]. Groups that requests merely named are not visited: the tick's cost follows the groups
    /// that exist, not the names clients send.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn groups_to_tick(&self) -> Result<Vec<GroupRef>, Error> {
        let rebuild = {
            let mut last = self.inner.index_rebuilt_at.lock().expect("index lock");
            let due = last.is_none_or(|t| t.elapsed() >= INDEX_REBUILD_PERIOD);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        let mut groups = self.list_groups(rebuild).await?.groups;
        let known: Vec<GroupRef> = {
            let slots = self.inner.groups.lock().expect("groups lock");
            slots
                .iter()
                .filter(|(_, slot)| slot.retained())
                .map(|((stream, group), _)| GroupRef {
                    stream: stream.clone(),
                    group: group.clone(),
                })
                .collect()
        };
        groups.extend(known);
        groups.sort();
        groups.dedup();
        Ok(groups)
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
            let mut conn = self.inner.store.connection();
            let (secs, micros): (u64, u64) = redis::cmd("TIME")
                .query_async(&mut conn)
                .await
                .map_err(StoreError::from)?;
            let now = secs * 1000 + micros / 1000;
            let grace = now + self.max_ttl_ms();
            self.inner.global_grace_until_ms.fetch_max(grace, Ordering::AcqRel);
            self.inner.stats.redis_restarts.fetch_add(1, Ordering::Relaxed);
            warn!("Redis run id changed: no member expires for one member TTL");
        }
        Ok(changed)
    }

    fn max_ttl_ms(&self) -> u64 {
        // Groups may have longer TTLs than the default; a global grace must cover the longest one we know.
        let groups = self.inner.groups.lock().expect("groups lock");
        groups
            .values()
            .filter_map(|s| {
                s.cache
                    .lock()
                    .expect("cache lock")
                    .aggregate
                    .as_ref()
                    .map(|(_, meta)| meta.timings.member_ttl_ms)
            })
            .max()
            .unwrap_or(0)
            .max(self.inner.config.default_timings.member_ttl_ms)
    }

    fn slot(&self, stream: &StreamName, group: &GroupName) -> Arc<GroupSlot> {
        let mut groups = self.inner.groups.lock().expect("groups lock");
        groups.entry((stream.clone(), group.clone())).or_default().clone()
    }

    /// A store error as answered: a corrupt hash counts as unreadable metadata.
    fn store_error(&self, e: StoreError) -> Error {
        match e {
            StoreError::Corrupt(message) => {
                self.inner.stats.metadata_corrupt.fetch_add(1, Ordering::Relaxed);
                self.unavailable(message)
            }
            other => Error::Store(other),
        }
    }

    /// Drops `slot` and, when its group was never found and nobody else uses the slot, forgets it: a request
    /// naming a group that does not exist leaves no state behind.
    fn forget_if_absent(&self, stream: &StreamName, group: &GroupName, slot: Arc<GroupSlot>) {
        if slot.present_at().is_some() {
            return;
        }
        let key = (stream.clone(), group.clone());
        let mut groups = self.inner.groups.lock().expect("groups lock");
        // New users clone the slot only under this lock: two references (the map's and ours) mean no other user.
        let unused = groups
            .get(&key)
            .is_some_and(|s| Arc::ptr_eq(s, &slot) && Arc::strong_count(&slot) == 2);
        if unused && slot.queue.lock().expect("queue lock").is_empty() {
            groups.remove(&key);
        }
    }

    /// Forgets every slot nobody uses whose group no load found within [`SLOT_RETENTION`] (never found, deleted,
    /// or idle). Returns how many slots remain. Run by the tick loop.
    pub fn evict_idle_slots(&self) -> usize {
        let mut groups = self.inner.groups.lock().expect("groups lock");
        groups.retain(|_, slot| {
            Arc::strong_count(slot) > 1 || !slot.queue.lock().expect("queue lock").is_empty() || slot.retained()
        });
        groups.len()
    }

    /// Whether a load of this process found the group (any group of the stream, for `None`) within
    /// [`SLOT_RETENTION`]: a trace Redis cannot lose, though only this process has it.
    fn seen_recently(&self, stream: &StreamName, group: Option<&GroupName>) -> bool {
        let groups = self.inner.groups.lock().expect("groups lock");
        groups
            .iter()
            .any(|((s, g), slot)| s == stream && group.is_none_or(|group| g == group) && slot.retained())
    }

    /// How many per-group slots this process holds.
    pub fn slot_count(&self) -> usize {
        self.inner.groups.lock().expect("groups lock").len()
    }

    /// Refuses group creation while Redis may evict the keys it would write (see [`crate::memory_policy`]).
    fn require_safe_eviction_policy(&self) -> Result<(), Error> {
        self.inner
            .eviction_policy
            .require_safe()
            .map_err(|e| StoreError::Unsupported(e).into())
    }

    /// The answer to a request for a group without metadata: never created (`NOT_FOUND`) or lost
    /// (`METADATA_UNAVAILABLE`), from the traces Redis still holds (see [`crate::traces`]).
    async fn absent_group(&self, stream: &StreamName, group: &GroupName) -> Error {
        let absence = match traces::of_group(&self.inner.store, stream, group).await {
            Ok(Absence::NeverCreated) if self.seen_recently(stream, Some(group)) => {
                Ok(Absence::Lost(traces::Trace::SeenByThisCoordinator))
            }
            other => other,
        };
        if let Ok(Absence::NeverCreated) = absence {
            return Error::NotFound(format!(
                "group {group} of stream {stream} was never created (Redis holds no metadata, index entry, liveness or consumer group of it): create it with POST /v1/streams/{stream}/groups/{group}, or check the names"
            ));
        }
        self.inner.stats.metadata_unavailable.fetch_add(1, Ordering::Relaxed);
        match absence {
            Ok(Absence::Lost(trace)) => Error::MetadataUnavailable(format!(
                "no metadata for group {group} of stream {stream}, but {trace} remains: the group existed and its metadata is lost; the coordinator does not rebuild it from heartbeats: recreate it explicitly"
            )),
            _ => missing_group(stream, group),
        }
    }

    /// Like [`Self::absent_group`] for a stream without routing.
    async fn absent_stream(&self, stream: &StreamName) -> Error {
        let absence = match traces::of_stream(&self.inner.store, stream).await {
            Ok(Absence::NeverCreated) if self.seen_recently(stream, None) => {
                Ok(Absence::Lost(traces::Trace::SeenByThisCoordinator))
            }
            other => other,
        };
        if let Ok(Absence::NeverCreated) = absence {
            return Error::NotFound(format!(
                "stream {stream} was never created (Redis holds no routing, index entry or shard of it): create a group of it with a shardCount, or check the name"
            ));
        }
        let trace = match absence {
            Ok(Absence::Lost(trace)) => format!("{trace} remains"),
            _ => "never created, or lost".to_owned(),
        };
        self.unavailable(format!("stream {stream} has no routing ({trace})"))
    }

    fn unavailable(&self, message: String) -> Error {
        self.inner.stats.metadata_unavailable.fetch_add(1, Ordering::Relaxed);
        self.inner.stats.metrics().metadata_unreadable(&message);
        Error::MetadataUnavailable(message)
    }

    /// Mutex + load, retrying while the mutex is busy, up to the critical-section deadline.
    async fn acquire(
        &self,
        keys: &SectionKeys,
        token: &str,
        cached: Option<Cached<'_>>,
        scope: LivenessScope<'_>,
    ) -> Result<Loaded, Error> {
        let started = Instant::now();
        let deadline = started + self.inner.config.critical_section_timeout;
        let mut backoff = Duration::from_millis(1);
        loop {
            let loaded = self
                .inner
                .store
                .try_load(keys, token, self.inner.config.mutex_ttl, cached, scope)
                .await
                .map_err(|e| self.store_error(e))?;
            if let Some(loaded) = loaded {
                self.inner.stats.observe_mutex_wait(started.elapsed());
                return Ok(loaded);
            }
            self.inner.stats.mutex_busy.fetch_add(1, Ordering::Relaxed);
            if Instant::now() + backoff > deadline {
                self.inner.stats.mutex_timeouts.fetch_add(1, Ordering::Relaxed);
                let waited_ms = started.elapsed().as_millis() as u64;
                return Err(StoreError::MutexBusy {
                    key: keys.mutex.clone(),
                    waited_ms,
                }
                .into());
            }
            let jitter = Duration::from_micros(rand::random::<u64>() % 1000);
            tokio::time::sleep(backoff + jitter).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// The critical section of a group (see the module docs). `f` may refuse with an error after seeing the
    /// loaded revision (admin `If-Match`); nothing is written then.
    async fn group_section<F>(
        &self,
        stream: &StreamName,
        group: &GroupName,
        scope: LivenessScope<'_>,
        f: F,
    ) -> Result<(Transition, StoreRevision), Error>
    where
        F: FnMut(&GroupMetadata, &Liveness, Clock, StoreRevision) -> Result<Transition, Error>,
    {
        let slot = self.slot(stream, group);
        let local = slot.lock.lock().await;
        let result = self.group_section_locked(stream, group, scope, f).await;
        drop(local);
        self.forget_if_absent(stream, group, slot);
        result
    }

    /// [`Self::group_section`] for a caller that already holds the group's local lock.
    async fn group_section_locked<F>(
        &self,
        stream: &StreamName,
        group: &GroupName,
        scope: LivenessScope<'_>,
        mut f: F,
    ) -> Result<(Transition, StoreRevision), Error>
    where
        F: FnMut(&GroupMetadata, &Liveness, Clock, StoreRevision) -> Result<Transition, Error>,
    {
        let slot = self.slot(stream, group);
        let _entered = self.inner.gate.enter().ok_or(Error::Terminating)?;
        let keys = SectionKeys::group(stream, group);
        let token = self.inner.store.token();
        for _ in 0..MAX_CAS_ATTEMPTS {
            let memory = slot.cache.lock().expect("cache lock").clone();
            let cached = memory.aggregate.as_ref().map(|(revision, _)| Cached {
                revision: *revision,
                digest: &memory.digest,
                len: memory.len,
            });
            let loaded = self.acquire(&keys, &token, cached, scope).await?;
            spans::reached(Boundary::Loaded, loaded.revision);
            if loaded.revision.is_some() {
                slot.mark_present();
            }
            let result = self.decide(stream, group, &slot, memory, &loaded, &mut f);
            let (t, rev) = match result {
                Ok(v) => v,
                Err(e) => {
                    self.release_quietly(&keys, &token).await;
                    spans::reached(Boundary::Released, loaded.revision);
                    if loaded.revision.is_none() {
                        // Looked up after the mutex is released: the lookup needs no lock, and only requests
                        // for groups without metadata pay for it.
                        return Err(self.absent_group(stream, group).await);
                    }
                    return Err(e);
                }
            };
            spans::reached(Boundary::Decided, Some(rev));
            if !t.writes() {
                self.inner.store.release(&keys, &token).await?;
                spans::reached(Boundary::Released, Some(rev));
                return Ok((t, rev));
            }
            #[cfg(feature = "fault-injection")]
            crate::fault::reached(self, crate::fault::Point::BeforeWrite, stream, group, &t).await?;
            let json = t.next.as_ref().map(GroupMetadata::encode);
            let write = Write {
                aggregate: json.as_deref(),
                replaces: &loaded.aggregate_digest,
                renew: &t.renew,
                forget: &t.forget,
                now_ms: loaded.now_ms,
                run_id: &loaded.run_id,
            };
            match self
                .inner
                .store
                .commit(&keys, &token, Some(rev), loaded.liveness_revision, &write)
                .await
                .map_err(|e| {
                    // The stored aggregate is not the one decided on: never serve that one from memory again.
                    slot.cache.lock().expect("cache lock").aggregate = None;
                    self.store_error(e)
                })? {
                Committed::Ok(new_rev) => {
                    if let (Some(next), Some(json)) = (&t.next, &json) {
                        let mut memory = slot.cache.lock().expect("cache lock");
                        memory.highest = memory.highest.max(next.metadata_version);
                        memory.aggregate = Some((new_rev, Arc::new(next.clone())));
                        memory.digest = store::digest(json.as_bytes());
                        memory.len = json.len();
                    }
                    spans::reached(Boundary::Committed, Some(new_rev));
                    self.log_events(stream, group, &t.events);
                    #[cfg(feature = "fault-injection")]
                    crate::fault::reached(self, crate::fault::Point::AfterWrite, stream, group, &t).await?;
                    return Ok((t, new_rev));
                }
                Committed::Conflict => {
                    self.inner.stats.revision_conflicts.fetch_add(1, Ordering::Relaxed);
                    debug!(group = %group, "revision conflict; reloading");
                    // Only the cached aggregate is stale; what this process saw (highest version, grace) stays.
                    slot.cache.lock().expect("cache lock").aggregate = None;
                }
            }
        }
        Err(StoreError::CasExhausted { key: keys.hash }.into())
    }

    /// Resolves the loaded metadata (cache or decode), the grace period, and runs `f`.
    fn decide<F>(
        &self,
        stream: &StreamName,
        group: &GroupName,
        slot: &GroupSlot,
        memory: GroupMemory,
        loaded: &Loaded,
        f: &mut F,
    ) -> Result<(Transition, StoreRevision), Error>
    where
        F: FnMut(&GroupMetadata, &Liveness, Clock, StoreRevision) -> Result<Transition, Error>,
    {
        let Some(rev) = loaded.revision else {
            slot.cache.lock().expect("cache lock").aggregate = None;
            // Counted by `absent_group`, which tells a lost group (counted) from a never-created one.
            return Err(missing_group(stream, group));
        };
        // Every load is checked, cached or not: the cache only saves the JSON parse.
        store::check_versions(loaded, store::schema_of_group()).map_err(|e| {
            self.inner.stats.metadata_corrupt.fetch_add(1, Ordering::Relaxed);
            self.unavailable(e)
        })?;
        let meta = match (&loaded.aggregate, &memory.aggregate) {
            (Some(json), _) => store::decode_group(loaded, json).map(Arc::new).map_err(|e| {
                // The cached aggregate is not the stored one any more.
                slot.cache.lock().expect("cache lock").aggregate = None;
                self.inner.stats.metadata_corrupt.fetch_add(1, Ordering::Relaxed);
                self.unavailable(e)
            })?,
            (None, Some((cached_rev, meta))) if loaded.cache_hit && *cached_rev == rev => meta.clone(),
            (None, _) => {
                self.inner.stats.metadata_corrupt.fetch_add(1, Ordering::Relaxed);
                return Err(self.unavailable(format!("group {group} metadata hash has a revision but no aggregate")));
            }
        };
        let ttl = meta.timings.member_ttl_ms;
        let now = loaded.now_ms;
        // First sight of the group by this process: grace (liveness facts may predate this process).
        let mut grace = memory.grace_until_ms.unwrap_or(now + ttl);
        let highest = memory.highest;
        let mut suspected_loss = None;
        let round_covers = meta
            .correction
            .as_ref()
            .is_some_and(|r| r.reported_max_version >= highest);
        if meta.metadata_version < highest && !round_covers {
            self.inner.stats.metadata_regressions.fetch_add(1, Ordering::Relaxed);
            warn!(group = %group, stored = %meta.metadata_version, seen = %highest,
                "metadata version regressed under this coordinator: correction round, no expiry for one member TTL");
            grace = grace.max(now + ttl);
            suspected_loss = Some(highest);
        }
        if loaded.run_id_changed() {
            self.inner.stats.metadata_regressions.fetch_add(1, Ordering::Relaxed);
            warn!(group = %group, stored_run_id = %loaded.stored_run_id, run_id = %loaded.run_id,
                "group metadata outlived a Redis restart or failover: correction round, no expiry for one member TTL");
            grace = grace.max(now + ttl);
            suspected_loss = Some(
                suspected_loss
                    .unwrap_or(meta.metadata_version)
                    .max(meta.metadata_version),
            );
        }
        if loaded.liveness_missing && !meta.members.is_empty() {
            // Every member's join wrote a liveness entry: a missing hash was deleted or evicted, not empty.
            self.inner.stats.metadata_regressions.fetch_add(1, Ordering::Relaxed);
            warn!(group = %group, "liveness hash missing while the group has members: no expiry for one member TTL");
            grace = grace.max(now + ttl);
            suspected_loss = Some(
                suspected_loss
                    .unwrap_or(meta.metadata_version)
                    .max(meta.metadata_version),
            );
        }
        {
            let mut memory = slot.cache.lock().expect("cache lock");
            if let Some(json) = &loaded.aggregate {
                memory.digest.clone_from(&loaded.aggregate_digest);
                memory.len = json.len();
            }
            memory.aggregate = Some((rev, meta.clone()));
            memory.highest = highest.max(meta.metadata_version);
            memory.grace_until_ms = Some(grace);
        }
        let clock = Clock {
            now_ms: now,
            expiry_allowed_from_ms: grace.max(self.inner.global_grace_until_ms.load(Ordering::Acquire)),
            suspected_loss,
        };
        let liveness: Liveness = loaded.liveness.iter().cloned().collect::<BTreeMap<_, _>>();
        let t = f(&meta, &liveness, clock, rev)?;
        Ok((t, rev))
    }

    async fn release_quietly(&self, keys: &SectionKeys, token: &str) {
        if let Err(e) = self.inner.store.release(keys, token).await {
            warn!(mutex = %keys.mutex, error = %e, "mutex release failed; it expires by its TTL");
        }
    }

    /// A critical section over a hash without liveness (stream routing, group creation). `f` returns the
    /// routing to write, or `None` to write nothing.
    async fn plain_section<F>(
        &self,
        keys: &SectionKeys,
        mut f: F,
    ) -> Result<(Option<StreamRouting>, StoreRevision), Error>
    where
        F: FnMut(&Loaded) -> Result<Option<StreamRouting>, Error>,
    {
        let _entered = self.inner.gate.enter().ok_or(Error::Terminating)?;
        let token = self.inner.store.token();
        for _ in 0..MAX_CAS_ATTEMPTS {
            let loaded = self.acquire(keys, &token, None, LivenessScope::None).await?;
            spans::reached(Boundary::Loaded, loaded.revision);
            let next = match f(&loaded) {
                Ok(n) => n,
                Err(e) => {
                    self.release_quietly(keys, &token).await;
                    spans::reached(Boundary::Released, loaded.revision);
                    return Err(e);
                }
            };
            spans::reached(Boundary::Decided, loaded.revision);
            let Some(next) = next else {
                self.inner.store.release(keys, &token).await?;
                spans::reached(Boundary::Released, loaded.revision);
                return Ok((None, loaded.revision.unwrap_or_default()));
            };
            let json = next.encode();
            let write = Write {
                aggregate: Some(&json),
                replaces: &loaded.aggregate_digest,
                now_ms: loaded.now_ms,
                run_id: &loaded.run_id,
                ..Write::default()
            };
            match self
                .inner
                .store
                .commit(keys, &token, loaded.revision, loaded.liveness_revision, &write)
                .await?
            {
                Committed::Ok(rev) => {
                    spans::reached(Boundary::Committed, Some(rev));
                    return Ok((Some(next), rev));
                }
                Committed::Conflict => {
                    self.inner.stats.revision_conflicts.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Err(StoreError::CasExhausted { key: keys.hash.clone() }.into())
    }

    fn decode_loaded_routing(&self, loaded: &Loaded) -> Result<StreamRouting, Error> {
        store::check_versions(loaded, store::schema_of_routing()).map_err(|e| self.unavailable(e))?;
        let json = loaded.aggregate.as_deref().unwrap_or_default();
        store::decode_routing(json).map_err(|e| self.unavailable(e))
    }

    async fn read_routing(&self, stream: &StreamName) -> Result<(StoreRevision, StreamRouting), Error> {
        let routing = self
            .inner
            .store
            .read_routing(stream)
            .await
            .map_err(|e| self.store_error(e))?;
        let Some((rev, json)) = routing else {
            return Err(self.absent_stream(stream).await);
        };
        let r = store::decode_routing(&json).map_err(|e| self.unavailable(e))?;
        Ok((rev, r))
    }

    /// The stream's routing, created with `shard_count` when missing; an existing one must match it.
    async fn ensure_routing(&self, stream: &StreamName, shard_count: Option<u32>) -> Result<StreamRouting, Error> {
        if let Some(n) = shard_count {
            if n == 0 || n > MAX_SHARDS {
                return Err(Error::InvalidRequest(format!("shardCount must be 1 to {MAX_SHARDS}")));
            }
        }
        let keys = SectionKeys::routing(stream);
        let lease_ms = self.inner.config.routing_lease.as_millis() as u64;
        let mut existing = None;
        let (created, _) = self
            .plain_section(&keys, |loaded| {
                if loaded.revision.is_some() {
                    let current = self.decode_loaded_routing(loaded)?;
                    if shard_count.is_some_and(|n| n != current.shard_count) {
                        return Err(Error::InvalidRequest(format!(
                            "stream {stream} has {} shards; use the add-shards endpoint to grow it",
                            current.shard_count
                        )));
                    }
                    existing = Some(current);
                    return Ok(None);
                }
                let Some(n) = shard_count else {
                    return Err(Error::InvalidRequest(format!(
                        "stream {stream} is new: shardCount is required"
                    )));
                };
                let mut r = StreamRouting::new(stream.clone(), n, loaded.now_ms);
                r.routing_lease_ms = lease_ms;
                Ok(Some(r))
            })
            .await?;
        Ok(created.or(existing).expect("either created or read"))
    }

    async fn insert_group(
        &self,
        stream: &StreamName,
        group: &GroupName,
        routing: &StreamRouting,
        timings: GroupTimings,
        recreate: bool,
    ) -> Result<GroupDescription, Error> {
        let _entered = self.inner.gate.enter().ok_or(Error::Terminating)?;
        let keys = SectionKeys::group(stream, group);
        let token = self.inner.store.token();
        let loaded = self.acquire(&keys, &token, None, LivenessScope::None).await?;
        spans::reached(Boundary::Loaded, loaded.revision);
        // A hash in any form (even without a revision: damaged) is never overwritten by a create.
        if loaded.revision.is_some() || self.group_exists(stream, group).await? {
            self.release_quietly(&keys, &token).await;
            spans::reached(Boundary::Released, loaded.revision);
            return Err(Error::AlreadyExists(format!(
                "group {group} of stream {stream} has a metadata hash"
            )));
        }
        let mut meta = state_machine::create_group(stream.clone(), group.clone(), routing, timings, loaded.now_ms);
        if recreate {
            meta.metadata_version = MetadataVersion(loaded.now_ms);
            meta.correction = Some(protocol::metadata::CorrectionRound {
                started_at_ms: loaded.now_ms,
                reported_max_version: meta.metadata_version,
                synced: Default::default(),
                claims: Default::default(),
            });
        }
        let json = meta.encode();
        let write = Write {
            aggregate: Some(&json),
            now_ms: loaded.now_ms,
            run_id: &loaded.run_id,
            ..Write::default()
        };
        // The liveness hash of a lost group may survive it: its entries name members the new group does not have
        // and are ignored; clear them so they cannot lengthen a future member's lease.
        let mut conn = self.inner.store.connection();
        let _: () = redis::cmd("DEL")
            .arg(&keys.liveness)
            .query_async(&mut conn)
            .await
            .map_err(StoreError::from)?;
        match self
            .inner
            .store
            .commit(&keys, &token, None, loaded.liveness_revision, &write)
            .await?
        {
            Committed::Ok(rev) => spans::reached(Boundary::Committed, Some(rev)),
            Committed::Conflict => {
                return Err(Error::AlreadyExists(format!(
                    "group {group} of stream {stream} was created concurrently"
                )))
            }
        }
        self.inner.store.index_group(stream, group).await?;
        info!(stream = %stream, group = %group, recreate, "group created");
        self.describe_group(stream, group).await
    }

    async fn group_exists(&self, stream: &StreamName, group: &GroupName) -> Result<bool, Error> {
        let mut conn = self.inner.store.connection();
        let n: i64 = redis::cmd("EXISTS")
            .arg(protocol::keys::group_metadata(stream, group))
            .query_async(&mut conn)
            .await
            .map_err(StoreError::from)?;
        Ok(n == 1)
    }

    /// The last rebalance events this instance decided (membership, ownership, correction rounds), newest first.
    /// Memory only, per instance: see [`crate::recent`].
    pub fn recent_rebalances(&self) -> Vec<RecentEvent> {
        self.inner.recent.newest_first()
    }

    fn log_events(&self, stream: &StreamName, group: &GroupName, events: &[Event]) {
        for e in events {
            self.inner.stats.event(e);
            self.inner.recent.record(stream, group, e);
            self.inner.stats.metrics().group_event(stream, group, e);
            match e {
                Event::ShardGranted { .. } | Event::ShardReleased { .. } => {
                    debug!(stream = %stream, group = %group, event = ?e, "coordinator event")
                }
                _ => info!(stream = %stream, group = %group, event = ?e, "coordinator event"),
            }
        }
    }
}

fn missing_group(stream: &StreamName, group: &GroupName) -> Error {
    Error::MetadataUnavailable(format!(
        "no metadata for group {group} of stream {stream}: never created, or lost; the coordinator does not rebuild \
         it from heartbeats: recreate it explicitly"
    ))
}

fn check_if_match(if_match: Option<StoreRevision>, stored: StoreRevision) -> Result<(), Error> {
    match if_match {
        Some(expected) if expected != stored => Err(Error::RevisionConflict {
            expected,
            found: stored,
        }),
        _ => Ok(()),
    }
}

fn routing_description(r: &StreamRouting, revision: StoreRevision) -> RoutingDescription {
    RoutingDescription {
        stream: r.stream.clone(),
        revision,
        routing_version: r.routing_version,
        shard_count: r.shard_count,
        routing_lease_ms: r.routing_lease_ms,
    }
}
