//! The short group timings every test suite uses, so that expiry, leases and rebalances play out within a test.
//!
//! One set for the coordinator's, the SDKs', the examples' and the scenario tests: a test that needs other
//! timings (a patient coordinator, a long lease) says so where it builds them.

use protocol::metadata::GroupTimings;
use std::time::Duration;

/// Member TTL: how long a member that stopped heartbeating keeps its shards.
pub const MEMBER_TTL: Duration = Duration::from_millis(2000);
/// Heartbeat interval.
pub const HEARTBEAT: Duration = Duration::from_millis(200);
/// Assignment lease: how long a member may read a shard past its last answered heartbeat.
pub const LEASE: Duration = Duration::from_millis(1500);
/// Rebalance timeout.
pub const REBALANCE_TIMEOUT: Duration = Duration::from_millis(3000);
/// Consumer lease safety margin: a consumer reads at most `LEASE - MARGIN` past its last successful send.
pub const MARGIN: Duration = Duration::from_millis(200);
/// Coordinator tick interval.
pub const TICK: Duration = Duration::from_millis(50);
/// Group mutex TTL: how long a section that died before its write blocks the group.
pub const MUTEX_TTL: Duration = Duration::from_millis(900);
/// Critical-section timeout. With [`MUTEX_TTL`], exactly the [`LEASE`]: `Config::check_timings` refuses a lease
/// that a dead section's mutex can outlast.
pub const SECTION_TIMEOUT: Duration = Duration::from_millis(600);

/// [`MEMBER_TTL`], [`HEARTBEAT`], [`REBALANCE_TIMEOUT`] and [`LEASE`] as a group's timings.
pub fn group_timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: millis(MEMBER_TTL),
        heartbeat_interval_ms: millis(HEARTBEAT),
        rebalance_timeout_ms: millis(REBALANCE_TIMEOUT),
        assignment_lease_ms: millis(LEASE),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_sections_mutex_cannot_outlast_the_lease() {
        assert!(MUTEX_TTL + SECTION_TIMEOUT <= LEASE);
        assert!(MARGIN < LEASE && HEARTBEAT < LEASE && LEASE < MEMBER_TTL);
        assert_eq!(group_timings().assignment_lease_ms, 1500);
    }
}
