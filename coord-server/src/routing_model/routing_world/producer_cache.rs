//! A producer's routing cache, as `stream-producer`'s `routing_cache.rs` keeps it: the routing in use and the
//! highest it ever saw, which its routing fetch reports.

use protocol::messages::RoutingQuery;
use protocol::RoutingVersion;

/// A producer's routing cache (`routing_cache.rs`): the routing in use and the highest it ever saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Producer {
    /// Version, shard count, `shardRecords` of the routing in use.
    pub cache: Option<(u64, u32, bool)>,
    pub max_version: u64,
    pub max_count: u32,
    /// Its routing fetch waits for a restoration in progress.
    pub waiting: bool,
}

impl Producer {
    pub(in crate::routing_model) fn query(&self) -> RoutingQuery {
        RoutingQuery {
            routing_version: RoutingVersion(self.cache.map_or(0, |c| c.0)),
            max_observed_version: RoutingVersion(self.max_version),
            max_shard_count: self.max_count,
        }
    }
}
