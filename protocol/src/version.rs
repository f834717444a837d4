//! Version and identity newtypes.
//!
//! Each counter has its own type so a routing version can never be compared with a metadata version by accident.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! counter {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            /// The value that follows this one.
            #[must_use]
            pub fn next(self) -> Self {
                Self(self.0.saturating_add(1))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

counter!(
    /// Version of a group's metadata: +1 on every committed change of the group aggregate (held still during a
    /// metadata correction round, see [`docs/protocol.md`]). Clients remember the highest one they saw.
    ///
    /// [`docs/protocol.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/protocol.md
    MetadataVersion(u64)
);
impl MetadataVersion {
    /// The largest version on the wire: 2^53 - 1, the largest integer every JSON implementation reads exactly
    /// (JavaScript's `Number.MAX_SAFE_INTEGER`). Heartbeats carrying more are refused, and the coordinator never
    /// stores more, so no stored version can fail the coordinator's own validation.
    pub const MAX_SAFE: MetadataVersion = MetadataVersion((1 << 53) - 1);
}

counter!(
    /// Version of a stream's routing (shard count, resharding records): +1 on every committed change.
    ///
    /// ```
    /// use protocol::RoutingVersion;
    ///
    /// let v = RoutingVersion(4);
    /// assert!(v.next() > v);
    /// assert_eq!(v.to_string(), "4");
    /// ```
    RoutingVersion(u64)
);
counter!(
    /// +1 whenever a group's target assignment changes. Identifies one rebalance decision.
    AssignmentEpoch(u64)
);
counter!(
    /// Compare-and-set counter of one Redis metadata hash: +1 on every write of the hash, whatever it changed.
    /// Used as the ETag of admin reads and the `If-Match` of admin mutations.
    StoreRevision(u64)
);

counter!(
    /// Fencing token of one shard of one group: strictly greater for every new owner of the shard (a new member
    /// or a new incarnation of the same member), and never reused across coordinator restarts, a Redis rollback
    /// or a recreated group (see [`docs/fencing.md`]). Pass it with every side effect of a handler so the target
    /// can refuse writes from an owner that lost the shard.
    ///
    /// ```
    /// use protocol::FencingToken;
    ///
    /// // What a fenced target keeps per key: the highest token it accepted.
    /// fn accept(highest: &mut FencingToken, presented: FencingToken) -> bool {
    ///     if presented < *highest {
    ///         return false; // an owner that lost the shard
    ///     }
    ///     *highest = presented;
    ///     true
    /// }
    /// let mut highest = FencingToken(7);
    /// assert!(accept(&mut highest, FencingToken(8)));
    /// assert!(!accept(&mut highest, FencingToken(7)));
    /// ```
    ///
    /// [`docs/fencing.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/fencing.md
    FencingToken(u64)
);

impl FencingToken {
    /// Largest token: the largest integer that JSON numbers hold exactly in every language (2^53 - 1).
    pub const MAX: FencingToken = FencingToken((1 << 53) - 1);
}

counter!(
    /// One incarnation of a member: what a join creates, minted by the coordinator and never reused within a
    /// group (like a fencing token, it stays above every incarnation of a lost history: see [`docs/protocol.md`],
    /// "Incarnations"). A member id is a name that a new process, or the same process after it gave its shards
    /// back, may take again; an incarnation names one join of one process. Every heartbeat, acknowledgement and
    /// leave names the incarnation it speaks for, and the coordinator applies it only to that incarnation.
    ///
    /// `0` names no incarnation: a process's first join.
    ///
    /// [`docs/protocol.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/protocol.md
    Incarnation(u64)
);

impl Incarnation {
    /// The largest incarnation: 2^53 - 1, exact in every JSON implementation.
    pub const MAX: Incarnation = Incarnation((1 << 53) - 1);
    /// "None yet": what a process's first join names.
    pub const NONE: Incarnation = Incarnation(0);
}

/// Epoch of one member incarnation's assignment. `0` asks to join, `-1` asks to leave; a live member holds the
/// assignment epoch at which its target last changed, so a new incarnation always gets a higher one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemberEpoch(pub i64);

impl MemberEpoch {
    /// The epoch a member sends to join (or rejoin after being fenced or forgotten).
    pub const JOIN: MemberEpoch = MemberEpoch(0);
    /// The epoch a member sends to leave the group.
    pub const LEAVE: MemberEpoch = MemberEpoch(-1);

    /// Whether this is the join request epoch.
    pub fn is_join(self) -> bool {
        self == Self::JOIN
    }

    /// Whether this is the leave request epoch.
    pub fn is_leave(self) -> bool {
        self == Self::LEAVE
    }
}

impl fmt::Display for MemberEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<AssignmentEpoch> for MemberEpoch {
    fn from(epoch: AssignmentEpoch) -> Self {
        // Assignment epochs stay far below i64::MAX: they count rebalances.
        MemberEpoch(i64::try_from(epoch.0).unwrap_or(i64::MAX))
    }
}

/// One shard of a logical stream, `0..shard_count`.
///
/// ```
/// use protocol::ShardId;
///
/// let shard = ShardId(3);
/// let mut lag_per_shard = vec![0u64; 8];
/// lag_per_shard[shard.index()] += 1;
/// assert_eq!(shard.to_string(), "3");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShardId(pub u32);

impl ShardId {
    /// The shard's index as a `usize`, for indexing per-shard tables.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_serialize_as_plain_numbers() {
        assert_eq!(serde_json::to_string(&MetadataVersion(7)).unwrap(), "7");
        assert_eq!(serde_json::to_string(&MemberEpoch::LEAVE).unwrap(), "-1");
        assert_eq!(serde_json::from_str::<ShardId>("3").unwrap(), ShardId(3));
    }

    #[test]
    fn next_saturates() {
        assert_eq!(MetadataVersion(u64::MAX).next(), MetadataVersion(u64::MAX));
        assert_eq!(AssignmentEpoch(1).next(), AssignmentEpoch(2));
    }

    #[test]
    fn fencing_tokens_order_numerically_and_stay_json_safe() {
        assert!(FencingToken(9) < FencingToken(10));
        assert_eq!(
            serde_json::to_string(&FencingToken(1_700_000_000_000)).unwrap(),
            "1700000000000"
        );
        assert_eq!(
            FencingToken::MAX.0 as f64 as u64,
            FencingToken::MAX.0,
            "exact as an f64"
        );
    }

    #[test]
    fn member_epoch_from_assignment_epoch() {
        assert_eq!(MemberEpoch::from(AssignmentEpoch(5)), MemberEpoch(5));
        assert!(MemberEpoch(0).is_join());
        assert!(MemberEpoch(-1).is_leave());
    }
}
