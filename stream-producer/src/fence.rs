//! The one rule that decides whether a shard takes a fenced write, shared by the checked transaction
//! (`write_path/fenced.rs`) and the publish script (`publish_script.rs`, which states it again in Lua).
//!
//! A shard's record (`protocol::keys::shard_fence`, in the shard's own hash slot) holds its fence (the lowest
//! routing version that may write there) and, once the coordinator writes shard records, the version whose
//! layout created the shard (`bornVersion`), written before any producer can learn of the shard. A write is
//! taken only when the producer's routing is at or above the fence and, where its routing promises records, the
//! shard's record says the shard exists at that routing. The second check is what keeps a producer that learned
//! a growth Redis then lost (a failover to a lagging replica) from writing acknowledged records into a shard no
//! group reads: it gets `Fenced`, refreshes (reporting what it saw, which restores the growth) and re-routes.
//! The record also holds the shard count of the layout at the fence and at the birth (`fenceCount`,
//! `bornCount`): a producer presenting fewer shards is refused too (see [`Presented::refusal`]).

use protocol::RoutingVersion;

/// What a fenced write presents to its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Presented {
    /// The routing version the records were routed with.
    pub version: RoutingVersion,
    /// The routing says every shard has its record: a shard without one does not exist at this routing.
    pub records: bool,
    /// The shard count of that routing (the layout: with jump consistent hashing a layout is its count).
    pub count: u32,
}

/// What a shard's record holds (`protocol::keys::shard_fence_fields`), as far as a write is concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ShardRecord {
    /// `routingVersion` (0: no fence).
    pub fence: RoutingVersion,
    /// `fenceCount`: the shard count of the layout at the fence (0: not recorded).
    pub fence_count: u32,
    /// `bornVersion` (`None`: no record).
    pub born: Option<RoutingVersion>,
    /// `bornCount`: the shard count of the layout that created the shard (0: not recorded).
    pub born_count: u32,
}

impl Presented {
    /// A routing that does not promise shard records: only the fence is checked.
    #[cfg(test)]
    pub fn unchecked(version: RoutingVersion) -> Presented {
        Presented {
            version,
            records: false,
            count: 0,
        }
    }

    /// `None`: the shard takes the write. `Some(v)`: refused, nothing may be written; `v` is the lowest routing
    /// version the refusal asks for (the fence, the shard's birth, or one above the producer's version when the
    /// shard has no record at all or records a layout with more shards than the producer's).
    ///
    /// The counts catch what versions cannot: a version issued again with another layout (an operator restored
    /// a snapshot into the running Redis), or a producer holding a lost history's higher number after a restore
    /// brought back lower ones. Within one history a later version never has fewer shards, so a producer at or
    /// above the fence (or the birth) with fewer shards than the record's routes by a layout the shard was not
    /// sealed (or created) for.
    pub fn refusal(self, record: ShardRecord) -> Option<RoutingVersion> {
        if self.version < record.fence {
            return Some(record.fence);
        }
        if !self.records {
            return None;
        }
        let newer = Some(RoutingVersion(self.version.0.saturating_add(1)));
        if record.fence_count > self.count {
            return newer;
        }
        match record.born {
            None => newer,
            Some(b) if b > self.version => Some(b),
            Some(_) if record.born_count > self.count => newer,
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
            count: 4,
        }
    }

    fn record(fence: u64, born: Option<u64>) -> ShardRecord {
        ShardRecord {
            fence: RoutingVersion(fence),
            born: born.map(RoutingVersion),
            ..ShardRecord::default()
        }
    }

    #[test]
    fn a_fence_above_the_producer_refuses_whatever_the_record_says() {
        assert_eq!(at(2, false).refusal(record(3, None)), Some(RoutingVersion(3)));
        assert_eq!(at(2, true).refusal(record(3, Some(1))), Some(RoutingVersion(3)));
    }

    #[test]
    fn without_records_promised_a_missing_record_is_not_checked() {
        assert_eq!(at(2, false).refusal(record(0, None)), None);
        assert_eq!(at(2, false).refusal(record(2, Some(9))), None);
    }

    #[test]
    fn with_records_promised_the_shard_must_exist_at_the_producers_routing() {
        // No record: a shard of a growth Redis lost. Ask for anything newer.
        assert_eq!(at(2, true).refusal(record(0, None)), Some(RoutingVersion(3)));
        // Born later than the producer's routing: a version number that meant another layout.
        assert_eq!(at(2, true).refusal(record(0, Some(5))), Some(RoutingVersion(5)));
        assert_eq!(at(2, true).refusal(record(2, Some(2))), None);
        assert_eq!(at(7, true).refusal(record(2, Some(1))), None);
    }

    #[test]
    fn a_layout_with_fewer_shards_than_the_record_names_is_refused() {
        // Fenced at v2 for 8 shards: the producer's v2 (or v9) with 4 shards is another history's layout.
        let sealed = ShardRecord {
            fence_count: 8,
            ..record(2, Some(1))
        };
        assert_eq!(at(2, true).refusal(sealed), Some(RoutingVersion(3)));
        assert_eq!(at(9, true).refusal(sealed), Some(RoutingVersion(10)));
        // Born at v2 into 8 shards: the same.
        let born = ShardRecord {
            born_count: 8,
            ..record(0, Some(2))
        };
        assert_eq!(at(2, true).refusal(born), Some(RoutingVersion(3)));
        // As many shards or more: this layout or a later one of the same history.
        let eight = Presented {
            count: 8,
            ..at(2, true)
        };
        assert_eq!(eight.refusal(sealed), None);
        assert_eq!(eight.refusal(born), None);
        assert_eq!(
            Presented {
                count: 12,
                ..at(2, true)
            }
            .refusal(sealed),
            None
        );
        // Counts are part of the record check: a routing that promises no records is not held to them.
        assert_eq!(at(2, false).refusal(sealed), None);
        // Records written before counts existed (0) are not checked.
        assert_eq!(at(2, true).refusal(record(2, Some(1))), None);
    }

    #[test]
    fn the_highest_version_does_not_overflow() {
        assert_eq!(
            at(u64::MAX, true).refusal(record(0, None)),
            Some(RoutingVersion(u64::MAX))
        );
    }
}
