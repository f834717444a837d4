//! Member leases: when a member counts as alive, when it is expired, and when a new incarnation's predecessor
//! may still be reading.
//!
//! A member's lease end is the later of what the aggregate records (`leaseUntilMs`, written at join and when
//! fenced) and what the liveness hash records (renewed by every accepted heartbeat without rewriting the
//! aggregate). Taking the later one is the safe direction: a lease that ends later only delays a shard move.

use protocol::metadata::MemberRecord;
use protocol::names::MemberId;

use super::transition::{Clock, Liveness};

/// The end of `member`'s lease, in Redis time (ms).
pub fn lease_end(id: &MemberId, member: &MemberRecord, liveness: &Liveness) -> u64 {
    liveness.get(id).copied().unwrap_or(0).max(member.lease_until_ms)
}

/// Whether the member's lease has run out and the coordinator may act on it (not within a start-up or
/// regression grace period, when liveness facts may have been lost with a Redis write).
pub fn is_expired(id: &MemberId, member: &MemberRecord, liveness: &Liveness, clock: Clock) -> bool {
    let end = lease_end(id, member, liveness);
    // The model check's injected bug (tests only): a group whose members never expire must fail its liveness.
    #[cfg(test)]
    if super::model::injected(super::model::Bug::NoExpiry) {
        return false;
    }
    clock.now_ms >= end && clock.now_ms >= clock.expiry_allowed_from_ms
}

/// Whether a previous incarnation of this member may still be reading the shards the member owns.
pub fn is_held(member: &MemberRecord, now_ms: u64) -> bool {
    member.hold_until_ms.is_some_and(|h| now_ms < h)
}

/// Whether the member's rebalance timeout has passed with shards still to drain.
pub fn rebalance_timed_out(member: &MemberRecord, rebalance_timeout_ms: u64, now_ms: u64) -> bool {
    member.fenced_at_ms.is_none()
        && member
            .revoking_since_ms
            .is_some_and(|since| now_ms >= since.saturating_add(rebalance_timeout_ms))
}
