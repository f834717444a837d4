//! The one rule that decides whether a shard takes a fenced write, shared by the checked transaction
//! (`publisher/transaction.rs`) and the publish script (`publish_script.rs`, which states it again in Lua).
//!
//! A shard's record (`protocol::keys::shard_fence`, in the shard's own hash slot) holds its fence (the lowest
//! routing version that may write there) and, once the coordinator writes shard records, the version whose
//! layout created the shard (`bornVersion`), written before any producer can learn of the shard. A write is
//! taken only when the producer's routing is at or above the fence and, where its routing promises records, the
//! shard's record says the shard exists at that routing. The second check is what keeps a producer that learned
//! a growth Redis then lost (a failover to a lagging replica) from writing acknowledged records into a shard no
//! group reads: it gets `Fenced`, refreshes (reporting what it saw, which restores the growth) and re-routes.

use protocol::RoutingVersion;

/// What a fenced write presents to its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Presented {
    /// The routing version the records were routed with.
    pub version: RoutingVersion,
    /// The routing says every shard has its record: a shard without one does not exist at this routing.
    pub records: bool,
}

impl Presented {
    /// A routing that does not promise shard records: only the fence is checked.
    #[cfg(test)]
    pub fn unchecked(version: RoutingVersion) -> Presented {
        Presented {
            version,
            records: false,
        }
    }

    /// `None`: the shard takes the write. `Some(v)`: refused, nothing may be written; `v` is the lowest routing
    /// version the refusal asks for (the fence, the shard's birth, or one above the producer's version when the
    /// shard has no record at all).
    pub fn refusal(self, fence: RoutingVersion, born: Option<RoutingVersion>) -> Option<RoutingVersion> {
        if self.version < fence {
            return Some(fence);
        }
        if !self.records {
            return None;
        }
        match born {
            None => Some(RoutingVersion(self.version.0.saturating_add(1))),
            Some(b) if b > self.version => Some(b),
            Some(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(v: u64, records: bool) -> Presented {
        Presented {
            version: RoutingVersion(v),
            records,
        }
    }

    #[test]
    fn a_fence_above_the_producer_refuses_whatever_the_record_says() {
        assert_eq!(at(2, false).refusal(RoutingVersion(3), None), Some(RoutingVersion(3)));
        assert_eq!(
            at(2, true).refusal(RoutingVersion(3), Some(RoutingVersion(1))),
            Some(RoutingVersion(3))
        );
    }

    #[test]
    fn without_records_promised_a_missing_record_is_not_checked() {
        assert_eq!(at(2, false).refusal(RoutingVersion(0), None), None);
        assert_eq!(at(2, false).refusal(RoutingVersion(2), Some(RoutingVersion(9))), None);
    }

    #[test]
    fn with_records_promised_the_shard_must_exist_at_the_producers_routing() {
        // No record: a shard of a growth Redis lost. Ask for anything newer.
        assert_eq!(at(2, true).refusal(RoutingVersion(0), None), Some(RoutingVersion(3)));
        // Born later than the producer's routing: a version number that meant another layout.
        assert_eq!(
            at(2, true).refusal(RoutingVersion(0), Some(RoutingVersion(5))),
            Some(RoutingVersion(5))
        );
        assert_eq!(at(2, true).refusal(RoutingVersion(2), Some(RoutingVersion(2))), None);
        assert_eq!(at(7, true).refusal(RoutingVersion(2), Some(RoutingVersion(1))), None);
    }

    #[test]
    fn the_highest_version_does_not_overflow() {
        assert_eq!(
            at(u64::MAX, true).refusal(RoutingVersion(0), None),
            Some(RoutingVersion(u64::MAX))
        );
    }
}
