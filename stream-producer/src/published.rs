//! [`Published`]: where a record was written, the success half of every publish outcome.

use protocol::{RoutingVersion, ShardId};

/// Where a record was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Published {
    /// The shard.
    pub shard: ShardId,
    /// The stream entry id Redis assigned (`<ms>-<seq>`).
    pub id: String,
    /// The routing version the shard was chosen with.
    pub routing_version: RoutingVersion,
}
