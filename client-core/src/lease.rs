//! The assignment lease: how long a consumer may keep reading without a fresh coordinator answer.
//!
//! Pure: no clock is read here. Every function takes the time as an argument, and the caller passes the instant
//! it captured *before sending* the heartbeat whose answer granted the lease. The instant type is generic
//! ([`LeaseInstant`]): the SDK uses a monotonic [`std::time::Instant`] or [`tokio::time::Instant`] (so paused
//! time moves it), a model checker uses logical milliseconds ([`Millis`]).
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
//!
//! # Example
//! ```
//! use client_core::lease::{effective_lease, Lease, Millis};
//! use std::time::Duration;
//!
//! let sent_at = Millis(1_000);
//! let mut lease = Lease::default();
//! lease.grant(sent_at, effective_lease(Duration::from_millis(1500), Duration::from_secs(8), Duration::from_millis(200)));
//! assert!(lease.is_valid_at(Millis(2_299)));
//! assert!(!lease.is_valid_at(Millis(2_300)), "ends at send time + (1500 - 200) ms");
//! ```

use std::fmt::Debug;
use std::time::Duration;

/// The lease the consumer actually uses: the coordinator's grant, capped by the consumer's own configured
/// maximum, minus the safety margin (which never takes more than half of it).
pub fn effective_lease(granted: Duration, cap: Duration, margin: Duration) -> Duration {
    let lease = granted.min(cap);
    lease.saturating_sub(margin).max(lease / 2)
}

/// A point in time a lease can be measured on: monotonic, ordered, and able to move forward by a [`Duration`].
pub trait LeaseInstant: Copy + Ord + Debug {
    /// `self + d` (saturating where the type has a bound).
    fn plus(self, d: Duration) -> Self;
    /// The time from `earlier` to `self`, zero if `earlier` is later.
    fn saturating_since(self, earlier: Self) -> Duration;
}

impl LeaseInstant for std::time::Instant {
    fn plus(self, d: Duration) -> Self {
        self + d
    }
    fn saturating_since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl LeaseInstant for tokio::time::Instant {
    fn plus(self, d: Duration) -> Self {
        self + d
    }
    fn saturating_since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// Logical time in milliseconds, for models and property tests that step time themselves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl LeaseInstant for Millis {
    fn plus(self, d: Duration) -> Self {
        Millis(self.0.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    }
    fn saturating_since(self, earlier: Self) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// The current lease: valid until an instant, or not held at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease<T = std::time::Instant> {
    valid_until: Option<T>,
}

impl<T> Default for Lease<T> {
    fn default() -> Self {
        Lease { valid_until: None }
    }
}

impl<T: LeaseInstant> Lease<T> {
    /// Records the lease granted by an answer to a heartbeat sent at `sent_at`. Replaces the previous grant:
    /// each grant is safe on its own (it ends before the TTL that the same heartbeat renewed), and answers are
    /// applied in the order their heartbeats were sent.
    pub fn grant(&mut self, sent_at: T, effective: Duration) {
        self.valid_until = Some(sent_at.plus(effective));
    }

    /// Drops the lease (the member was fenced, forgotten, or left).
    pub fn revoke(&mut self) {
        self.valid_until = None;
    }

    /// Whether reading is allowed at `now`.
    pub fn is_valid_at(&self, now: T) -> bool {
        self.valid_until.is_some_and(|until| now < until)
    }

    /// When the lease runs out, if one is held.
    pub fn expires_at(&self) -> Option<T> {
        self.valid_until
    }

    /// Time left at `now` (zero when expired or not held).
    pub fn remaining_at(&self, now: T) -> Duration {
        self.valid_until
            .map_or(Duration::ZERO, |until| until.saturating_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

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
    fn logical_time_gives_the_same_answers() {
        let mut lease = Lease::default();
        lease.grant(Millis(10), 1000 * MS);
        assert!(lease.is_valid_at(Millis(1_009)));
        assert!(!lease.is_valid_at(Millis(1_010)));
        assert_eq!(lease.remaining_at(Millis(310)), 700 * MS);
        assert_eq!(lease.remaining_at(Millis(5_000)), Duration::ZERO);
        lease.grant(Millis(u64::MAX - 1), 1000 * MS);
        assert_eq!(lease.expires_at(), Some(Millis(u64::MAX)), "saturates");
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
}
