//! How far a version a client reports may move the stored one.
//!
//! A real lost history is bounded: `metadataVersion` counts commits of the aggregate (+1 each, and aggregate
//! commits are membership and ownership changes, not heartbeats), starts at 1, or at Redis time in ms when a
//! group is recreated, and Redis loses only a recent window of writes. So a version a client saw in a lost
//! history is at most the stored version or the Redis clock, whichever is higher, plus the commits that outran
//! the clock since a recreate and the clock difference between the Redis servers of a failover. A buggy or
//! hostile client can send anything up to the wire limit. Rules (see `docs/design-decisions.md`, "Version
//! bounds"):
//! * a reported version counts as evidence of lost writes only up to [`report_ceiling`]; above it the report is
//!   ignored (the request is served as if it carried the stored version);
//! * no version the coordinator writes exceeds [`MetadataVersion::MAX_SAFE`], the limit it enforces on requests.

use protocol::MetadataVersion;

/// Slack above `max(stored, Redis now)` for a version from a lost history: one day, in ms (clock differences
/// between the Redis servers of a failover, and commits that outran the ms clock since a recreate).
pub const LOST_HISTORY_SLACK: u64 = 24 * 60 * 60 * 1000;

/// No report above this counts, whatever the clock says: it leaves 2^52 commits below the wire limit, so retiring
/// a reported version can never push the stored one out of what requests may echo.
pub const REPORT_LIMIT: MetadataVersion = MetadataVersion(1 << 52);

/// The highest reported version that can come from a lost history of a group storing `stored` at `now_ms`.
pub fn report_ceiling(stored: MetadataVersion, now_ms: u64) -> MetadataVersion {
    let base = stored.0.max(now_ms);
    MetadataVersion(base.saturating_add(LOST_HISTORY_SLACK).min(REPORT_LIMIT.0))
}

/// The version after a commit, never above what requests may carry.
pub fn bump(version: MetadataVersion) -> MetadataVersion {
    version.next().min(MetadataVersion::MAX_SAFE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_follows_the_clock_and_the_stored_version() {
        let now = 1_764_000_000_000;
        assert_eq!(
            report_ceiling(MetadataVersion(12), now),
            MetadataVersion(now + LOST_HISTORY_SLACK)
        );
        let recreated = MetadataVersion(now + 5);
        assert_eq!(
            report_ceiling(recreated, now),
            MetadataVersion(now + 5 + LOST_HISTORY_SLACK)
        );
    }

    #[test]
    fn ceiling_and_bump_never_leave_the_json_safe_range() {
        assert_eq!(report_ceiling(MetadataVersion::MAX_SAFE, u64::MAX), REPORT_LIMIT);
        assert_eq!(report_ceiling(MetadataVersion(0), u64::MAX), REPORT_LIMIT);
        assert!(bump(REPORT_LIMIT) < MetadataVersion::MAX_SAFE);
        assert_eq!(bump(MetadataVersion::MAX_SAFE), MetadataVersion::MAX_SAFE);
        assert_eq!(bump(MetadataVersion(u64::MAX)), MetadataVersion::MAX_SAFE);
    }
}
