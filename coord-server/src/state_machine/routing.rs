//! The routing answer of a producer: the stored routing, and `SYNC_METADATA` when the producer has seen a newer
//! routing than Redis stores (a lost write): it must adopt the stored one.

use protocol::messages::{RoutingQuery, RoutingResponse};
use protocol::metadata::StreamRouting;
use protocol::Status;

/// The answer to a producer's routing fetch `query` when Redis stores `stored`.
pub fn answer(stored: &StreamRouting, query: &RoutingQuery) -> RoutingResponse {
    let regressed =
        query.max_observed_version > stored.routing_version || query.routing_version > stored.routing_version;
    RoutingResponse {
        status: if regressed { Status::SyncMetadata } else { Status::Ok },
        stream: stored.stream.clone(),
        routing_version: stored.routing_version,
        shard_count: stored.shard_count,
        routing_lease_ms: stored.routing_lease_ms,
        // Three refreshes per lease: two may fail before the lease ends.
        refresh_interval_ms: (stored.routing_lease_ms / 3).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::names::StreamName;
    use protocol::RoutingVersion;

    fn stored(version: u64) -> StreamRouting {
        let mut r = StreamRouting::new(StreamName::new("s").unwrap(), 4, 0);
        r.routing_version = RoutingVersion(version);
        r
    }

    fn query(current: u64, max_observed: u64) -> RoutingQuery {
        RoutingQuery {
            routing_version: RoutingVersion(current),
            max_observed_version: RoutingVersion(max_observed),
        }
    }

    /// Seed scenario 5: the producer observed a routing version Redis no longer stores.
    #[test]
    fn a_higher_observed_version_is_answered_sync_metadata_with_the_stored_routing() {
        let r = answer(&stored(3), &query(3, 5));
        assert_eq!(r.status, Status::SyncMetadata);
        assert_eq!(r.routing_version, RoutingVersion(3));
        assert_eq!(r.shard_count, 4);
    }

    #[test]
    fn a_higher_current_version_is_answered_sync_metadata_too() {
        let r = answer(&stored(3), &query(4, 0));
        assert_eq!(r.status, Status::SyncMetadata);
        assert_eq!(r.routing_version, RoutingVersion(3));
    }

    #[test]
    fn an_equal_or_lower_version_is_answered_ok() {
        for (current, max_observed) in [(3, 3), (2, 3), (0, 0), (1, 2)] {
            let r = answer(&stored(3), &query(current, max_observed));
            assert_eq!(r.status, Status::Ok, "{current}/{max_observed}");
            assert_eq!(r.routing_version, RoutingVersion(3));
        }
    }

    #[test]
    fn the_refresh_interval_is_a_third_of_the_lease_and_never_zero() {
        let mut r = stored(1);
        r.routing_lease_ms = 30_000;
        assert_eq!(answer(&r, &query(1, 1)).refresh_interval_ms, 10_000);
        assert_eq!(answer(&r, &query(1, 1)).routing_lease_ms, 30_000);
        r.routing_lease_ms = 2;
        assert_eq!(answer(&r, &query(1, 1)).refresh_interval_ms, 1);
    }
}
