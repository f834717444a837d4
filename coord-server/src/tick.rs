//! The tick loop: drives time-based transitions (expiry, fencing after the rebalance timeout, hold ends, routing
//! adoption, closing correction rounds), since no request may come to trigger them. Each tick visits only the
//! groups the due index says are due, plus a slice of the safety sweep (see [`crate::due`]): its cost follows
//! the deadlines, not the number of groups.
//!
//! A tick is a critical section like a heartbeat (see [`crate::coordinator`]), so ticks from several
//! coordinator replicas, and heartbeats, serialise on the group's Redis mutex; running the loop in every replica
//! is safe, only redundant.

use std::collections::{BTreeMap, BTreeSet};

use protocol::messages::GroupRef;
use protocol::metadata::StreamRouting;
use protocol::names::StreamName;
use protocol::Status;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::coordinator::damaged_keys::{warn_limited, Damage, DamagedKey};
use crate::coordinator::Coordinator;
use crate::due::Reason;

/// Ticks the due groups every `config.tick_interval` until `cancel` fires or shutdown begins.
///
/// An error on one group is logged and the loop goes on: one broken group must not stop the others from
/// expiring members. Groups whose metadata is missing are skipped quietly (they are `METADATA_UNAVAILABLE` to
/// every request already, and the tick never recreates them).
///
/// # Cancel safety
/// Cancelling `cancel` stops the loop between two groups; a group tick already started finishes, so its mutex
/// is released by its own write. The tick's Redis calls outside any group's section (restart and policy checks,
/// the due index, the group list, the closing due-index write) are abandoned instead: they hold no mutex, and
/// with Redis unreachable each one waits seconds for a connection a shutdown must not wait for. Dropping the future instead (aborting the task) may leave a mutex held until
/// its TTL, like a crash.
pub async fn run(coordinator: Coordinator, cancel: CancellationToken) {
    let period = coordinator.config().tick_interval;
    // The first tick comes one period after start, not at once: a coordinator that just started gives every
    // member a grace period anyway, and tests can then start one with a long interval and no tick at all.
    let Some(first) = tokio::time::Instant::now().checked_add(period) else {
        // A period too long to represent never ticks.
        cancel.cancelled().await;
        return;
    };
    // `Config::validate` refuses a zero period, the one value `interval_at` panics on.
    let mut interval = tokio::time::interval_at(first, period);
    // After a slow tick (many groups, slow Redis) wait a full interval rather than firing a burst to catch up.
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            _ = interval.tick() => {}
        }
        if coordinator.gate().is_terminating() {
            break;
        }
        tick_once(&coordinator, &cancel).await;
        // `build_recorder` runs no upkeep of its own: drain histogram samples here so memory stays bounded even
        // when nobody scrapes `/metrics`.
        coordinator.stats().metrics().upkeep();
    }
    debug!("tick loop stopped");
}

/// One pass over the groups that are due, and the safety sweep's slice (see [`Coordinator::groups_to_visit`]).
/// Returns how many groups were ticked successfully.
///
/// Also forgets per-group state nobody uses any more (see [`Coordinator::evict_idle_slots`]), keeps the cached
/// aggregates within their budget ([`Coordinator::trim_cached_aggregates`]) and, every
/// [`crate::memory_policy::CHECK_PERIOD`], reads Redis's `maxmemory-policy` again.
pub async fn tick_once(coordinator: &Coordinator, cancel: &CancellationToken) -> usize {
    coordinator.evict_idle_slots();
    coordinator.trim_cached_aggregates();
    let restarted = match unless_cancelled(cancel, coordinator.check_redis_restart()).await {
        None => return 0,
        Some(Ok(changed)) => changed,
        Some(Err(e)) => {
            coordinator.stats().metrics().error(&e);
            warn!(error = %e, "Redis restart check failed");
            false
        }
    };
    if coordinator.eviction_policy().due() {
        if let Some(Err(e)) = unless_cancelled(cancel, coordinator.check_eviction_policy()).await {
            coordinator.stats().metrics().error(&e);
            warn!(error = %e, "maxmemory-policy check failed");
        }
    }
    // Never empty for want of the due index: the safety sweep's slice comes from the groups index (or a SCAN).
    let Some(visits) = unless_cancelled(cancel, coordinator.groups_to_visit()).await else {
        return 0;
    };
    // A stream is tended (`Coordinator::tend_routing`: a growth Redis lost from the routing is restored from the
    // shards' records, a lost record written again) right before its groups are visited, which adopt the routing
    // as tended. Tended are the streams of due visits; those of sweep visits only where Redis can lose records
    // without the run id saying so (`Coordinator::sweeps_tend_routing`); and, on a coordinator's first tick and for
    // one member TTL after a restart or failover (when Redis loses part of a routing), every stream with a group,
    // since producers writing to a lost growth's children are refused until then. A stream not tended is read by
    // its groups' visits themselves.
    let mut tended: BTreeSet<StreamName> = BTreeSet::new();
    let mut by_stream: BTreeMap<StreamName, Vec<(GroupRef, Reason)>> = BTreeMap::new();
    if coordinator.tends_every_routing(restarted) {
        match unless_cancelled(cancel, coordinator.list_groups(false)).await {
            None => return 0,
            Some(Ok(all)) => {
                for g in all.groups {
                    tended.insert(g.stream.clone());
                    by_stream.entry(g.stream).or_default();
                }
            }
            Some(Err(e)) => warn_limited("read/tend_all", "cannot list the groups to tend every routing", &e),
        }
    }
    for (g, reason) in visits {
        if reason == Reason::Due || coordinator.sweeps_tend_routing() {
            tended.insert(g.stream.clone());
        }
        by_stream.entry(g.stream.clone()).or_default().push((g, reason));
    }
    let mut scored = Vec::new();
    let mut gone = Vec::new();
    'streams: for (stream, groups) in by_stream {
        if cancel.is_cancelled() || coordinator.gate().is_terminating() {
            break;
        }
        let routing = if tended.contains(&stream) {
            tend(coordinator, &stream).await
        } else {
            None
        };
        for (g, reason) in groups {
            if cancel.is_cancelled() || coordinator.gate().is_terminating() {
                break 'streams;
            }
            coordinator.count_visit(reason);
            match coordinator.visit_group(&g.stream, &g.group, routing.clone()).await {
                Ok(s) => scored.push((g, s)),
                Err(e) => {
                    coordinator.stats().metrics().error(&e);
                    match e.status() {
                        Status::MetadataUnavailable | Status::NotFound => {
                            debug!(stream = %g.stream, group = %g.group, error = %e, "group metadata unavailable; not ticked");
                            // Out of the due index: the sweep visits it again, and scores it if it comes back.
                            gone.push(g);
                        }
                        Status::CoordinatorTerminating => break 'streams,
                        // Left as it was (due): visited again next tick.
                        _ => warn!(stream = %g.stream, group = %g.group, error = %e, "group tick failed"),
                    }
                }
            }
        }
    }
    // One ZADD for every visit of this tick (a visit that failed keeps its score: due, so retried next tick). Left
    // out on shutdown, like a failed visit: the groups stay due, and the next tick anywhere visits them again.
    let Some(lacked) = unless_cancelled(cancel, coordinator.record_due(&scored, &gone)).await else {
        return scored.len();
    };
    coordinator.report_damage(
        DamagedKey::DueIndex,
        Damage::Lost,
        lacked,
        None,
        &"groups the due index lacked were scored again",
    );
    scored.len()
}

/// `call`'s output, or `None` once `cancel` fires first (deadline checked first, see [`run`]'s cancel safety).
async fn unless_cancelled<T>(cancel: &CancellationToken, call: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        out = call => Some(out),
    }
}

/// [`Coordinator::tend_routing`] of one stream; the routing as tended, `None` when it failed (logged; the visits
/// then read the routing themselves).
async fn tend(coordinator: &Coordinator, stream: &StreamName) -> Option<StreamRouting> {
    match coordinator.tend_routing(stream).await {
        Ok(routing) => Some(routing),
        Err(e) => {
            coordinator.stats().metrics().error(&e);
            match e.status() {
                Status::MetadataUnavailable | Status::NotFound | Status::CoordinatorTerminating => {
                    debug!(stream = %stream, error = %e, "routing not tended")
                }
                // A damaged routing fails here on every tick: its visits count it (`routing_to_adopt`).
                _ => warn_limited(&format!("tend/{stream}"), "routing check failed", &e),
            }
            None
        }
    }
}
