//! [`Published`]: where a record was written, the success half of every publish outcome.

use protocol::{EntryId, RoutingVersion, ShardId};

/// Where a record was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Published {
    /// The shard.
    pub shard: ShardId,
    /// The stream entry id Redis assigned (`<ms>-<seq>` when displayed; ordered as Redis orders them).
    pub id: EntryId,
    /// The routing version the shard was chosen with.
    pub routing_version: RoutingVersion,
    /// The idempotent producer retried the record's call after an unknown outcome, and the shard answered that
    /// an earlier attempt had written it: `id` is that attempt's entry id, and the record is in the stream once.
    pub duplicate: bool,
}
