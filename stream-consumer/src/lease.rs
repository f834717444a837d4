//! The assignment lease: how long the consumer may keep reading without a fresh coordinator answer.
//!
//! Pure: every function takes the time as an argument, and the caller passes the monotonic [`Instant`] it
//! captured *before sending* the heartbeat whose answer granted the lease.
//!
//! # Why the send time
//! The coordinator renews the member's TTL when it *receives* the heartbeat, which is after the client sent it.
//! A lease counted from the send time therefore ends no later than the TTL the coordinator counts (the group
//! rule is `assignment lease <= member TTL`), whatever the network delay: the consumer always stops reading
//! before the coordinator can expire it and hand its shards to someone else. Counting from the receive time of
//! the answer would stretch the lease by the round trip, which is exactly the wrong direction.
//!
//! # Safety margin
//! The granted lease is shortened by a configured margin (clock-rate differences between the client's monotonic
//! clock and Redis `TIME`, and the time a reader needs to notice). The margin never takes more than half the
//! lease, so a misconfigured margin degrades into a short lease instead of no lease at all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The lease the consumer actually uses: the coordinator's grant, capped by the consumer's own configured
/// maximum, minus the safety margin (which never takes more than half of it).
pub(crate) fn effective_lease(granted: Duration, cap: Duration, margin: Duration) -> Duration {
    let lease = granted.min(cap);
    lease.saturating_sub(margin).max(lease / 2)
}

/// The current lease: valid until an instant, or not held at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Lease {
    valid_until: Option<Instant>,
}

impl Lease {
    /// Records the lease granted by an answer to a heartbeat sent at `sent_at`. Replaces the previous grant:
    /// each grant is safe on its own (it ends before the TTL that the same heartbeat renewed), and answers are
    /// applied in the order their heartbeats were sent.
    pub(crate) fn grant(&mut self, sent_at: Instant, effective: Duration) {
        self.valid_until = Some(sent_at + effective);
    }

    /// Drops the lease (the member was fenced, forgotten, or left).
    pub(crate) fn revoke(&mut self) {
        self.valid_until = None;
    }

    /// Whether reading is allowed at `now`.
    pub(crate) fn is_valid_at(&self, now: Instant) -> bool {
        self.valid_until.is_some_and(|until| now < until)
    }

    /// When the lease runs out, if one is held.
    pub(crate) fn expires_at(&self) -> Option<Instant> {
        self.valid_until
    }

    /// Time left at `now` (zero when expired or not held).
    pub(crate) fn remaining_at(&self, now: Instant) -> Duration {
        self.valid_until
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now))
    }
}

/// A lock-free copy of the lease end shared with the shard readers, so a reader checks the lease itself before
/// every read and every message instead of waiting for the heartbeat loop to stop it.
#[derive(Debug)]
pub(crate) struct LeaseView {
    /// Reference point of the stored offsets (an `Instant` cannot be stored atomically).
    base: Instant,
    /// Nanoseconds from `base` to the lease end; 0 when no lease is held.
    until_nanos: AtomicU64,
}

impl LeaseView {
    /// A view with no lease, measuring from `base`.
    pub(crate) fn new(base: Instant) -> Self {
        LeaseView {
            base,
            until_nanos: AtomicU64::new(0),
        }
    }

    /// Publishes `lease`.
    pub(crate) fn publish(&self, lease: &Lease) {
        let nanos = lease.expires_at().map_or(0, |until| {
            // An end at or before `base` stores 0, which reads as "no lease": right, as every `now` is past it.
            u64::try_from(until.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
        });
        self.until_nanos.store(nanos, Ordering::Release);
    }

    /// Whether the published lease is valid at `now`.
    pub(crate) fn is_valid_at(&self, now: Instant) -> bool {
        let until = self.until_nanos.load(Ordering::Acquire);
        if until == 0 {
            return false;
        }
        let now = u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        now < until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn lease_expires_from_send_time() {
        let t0 = Instant::now();
        let mut lease = Lease::default();
        // Sent at t0, answered 300 ms later: the lease still counts from t0.
        lease.grant(t0, 1000 * MS);
        assert!(lease.is_valid_at(t0 + 300 * MS));
        assert!(lease.is_valid_at(t0 + 999 * MS));
        assert!(!lease.is_valid_at(t0 + 1000 * MS), "ends exactly at send time + lease");
        assert_eq!(lease.remaining_at(t0 + 300 * MS), 700 * MS);
        assert_eq!(lease.remaining_at(t0 + 2000 * MS), Duration::ZERO);
    }

    #[test]
    fn no_lease_before_the_first_grant_and_after_revoke() {
        let t0 = Instant::now();
        let mut lease = Lease::default();
        assert!(!lease.is_valid_at(t0));
        assert_eq!(lease.expires_at(), None);
        lease.grant(t0, 1000 * MS);
        lease.revoke();
        assert!(!lease.is_valid_at(t0));
    }

    #[test]
    fn a_later_grant_replaces_the_earlier_one() {
        let t0 = Instant::now();
        let mut lease = Lease::default();
        lease.grant(t0, 1000 * MS);
        lease.grant(t0 + 200 * MS, 1000 * MS);
        assert_eq!(lease.expires_at(), Some(t0 + 1200 * MS));
        // The coordinator shortened its lease: the newest grant wins even though it ends earlier.
        lease.grant(t0 + 300 * MS, 500 * MS);
        assert_eq!(lease.expires_at(), Some(t0 + 800 * MS));
    }

    #[test]
    fn effective_lease_is_capped_and_shortened_by_the_margin() {
        assert_eq!(effective_lease(1500 * MS, 8000 * MS, 200 * MS), 1300 * MS);
        assert_eq!(
            effective_lease(9000 * MS, 8000 * MS, 500 * MS),
            7500 * MS,
            "capped by the client"
        );
        assert_eq!(
            effective_lease(1000 * MS, 8000 * MS, 900 * MS),
            500 * MS,
            "the margin never takes more than half"
        );
        assert_eq!(effective_lease(Duration::ZERO, 8000 * MS, 200 * MS), Duration::ZERO);
    }

    #[test]
    fn view_follows_the_published_lease() {
        let base = Instant::now();
        let view = LeaseView::new(base);
        assert!(!view.is_valid_at(base));
        let mut lease = Lease::default();
        lease.grant(base + 100 * MS, 1000 * MS);
        view.publish(&lease);
        assert!(view.is_valid_at(base + 500 * MS));
        assert!(!view.is_valid_at(base + 1100 * MS));
        lease.revoke();
        view.publish(&lease);
        assert!(!view.is_valid_at(base + 500 * MS));
    }
}
