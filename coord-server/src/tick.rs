//! The tick loop: drives time-based transitions (expiry, fencing after the rebalance timeout, hold ends, routing
//! adoption, closing correction rounds) of every group, since no request may come to trigger them.
//!
//! A tick is a critical section like a heartbeat (see [`crate::coordinator`]), so ticks from several
//! coordinator replicas, and heartbeats, serialise on the group's Redis mutex; running the loop in every replica
//! is safe, only redundant.

use protocol::Status;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::coordinator::Coordinator;

/// Ticks every group every `config.tick_interval` until `cancel` fires or shutdown begins.
///
/// An error on one group is logged and the loop goes on: one broken group must not stop the others from
/// expiring members. Groups whose metadata is missing are skipped quietly (they are `METADATA_UNAVAILABLE` to
/// every request already, and the tick never recreates them).
///
/// # Cancel safety
/// Cancelling `cancel` stops the loop between two groups; a group tick already started finishes, so its mutex
/// is released by its own write. Dropping the future instead (aborting the task) may leave a mutex held until
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

/// One pass over every indexed group. Returns how many groups were ticked successfully.
///
/// Also forgets per-group state nobody uses any more (see [`Coordinator::evict_idle_slots`]) and, every
/// [`crate::memory_policy::CHECK_PERIOD`], reads Redis's `maxmemory-policy` again.
pub async fn tick_once(coordinator: &Coordinator, cancel: &CancellationToken) -> usize {
    coordinator.evict_idle_slots();
    if let Err(e) = coordinator.check_redis_restart().await {
        coordinator.stats().metrics().error(&e);
        warn!(error = %e, "Redis restart check failed");
    }
    if coordinator.eviction_policy().due() {
        if let Err(e) = coordinator.check_eviction_policy().await {
            coordinator.stats().metrics().error(&e);
            warn!(error = %e, "maxmemory-policy check failed");
        }
    }
    let groups = match coordinator.groups_to_tick().await {
        Ok(groups) => groups,
        Err(e) => {
            coordinator.stats().metrics().error(&e);
            warn!(error = %e, "cannot list groups; skipping this tick");
            return 0;
        }
    };
    // Each stream's routing once per pass, before its groups adopt it: a growth Redis lost from the routing is
    // restored from the shards' records (and a routing without records gets them).
    let mut streams: Vec<&protocol::names::StreamName> = groups.iter().map(|g| &g.stream).collect();
    streams.dedup();
    streams.sort();
    streams.dedup();
    for stream in streams {
        if cancel.is_cancelled() || coordinator.gate().is_terminating() {
            return 0;
        }
        if let Err(e) = coordinator.tend_routing(stream).await {
            coordinator.stats().metrics().error(&e);
            match e.status() {
                Status::MetadataUnavailable | Status::NotFound | Status::CoordinatorTerminating => {
                    debug!(stream = %stream, error = %e, "routing not tended")
                }
                _ => warn!(stream = %stream, error = %e, "routing check failed"),
            }
        }
    }
    let mut ticked = 0;
    for g in groups {
        if cancel.is_cancelled() || coordinator.gate().is_terminating() {
            break;
        }
        match coordinator.tick_group(&g.stream, &g.group).await {
            Ok(()) => ticked += 1,
            Err(e) => {
                coordinator.stats().metrics().error(&e);
                match e.status() {
                    Status::MetadataUnavailable | Status::NotFound => {
                        debug!(stream = %g.stream, group = %g.group, error = %e, "group metadata unavailable; not ticked")
                    }
                    Status::CoordinatorTerminating => break,
                    _ => warn!(stream = %g.stream, group = %g.group, error = %e, "group tick failed"),
                }
            }
        }
    }
    ticked
}
