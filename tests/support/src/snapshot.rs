//! Point-in-time copies of the keys matching a pattern.

/// The keys matching a glob pattern at one instant, taken by
/// [`RedisServer::snapshot_keys`](crate::RedisServer::snapshot_keys) and put
/// back by [`RedisServer::restore_snapshot`](crate::RedisServer::restore_snapshot).
///
/// Used to roll related keys back together, e.g. a group's metadata hash and
/// its liveness hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub(crate) pattern: String,
    pub(crate) entries: Vec<SnapshotEntry>,
}

/// One captured key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotEntry {
    pub(crate) key: String,
    /// `DUMP` output.
    pub(crate) dump: Vec<u8>,
    /// Remaining time to live when captured; `None` for no expiry.
    pub(crate) ttl_ms: Option<u64>,
}

impl Snapshot {
    /// The glob pattern the snapshot covers.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The captured keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|entry| entry.key.as_str())
    }

    /// Whether `key` existed (and matched the pattern) when captured.
    pub fn contains(&self, key: &str) -> bool {
        self.entries.iter().any(|entry| entry.key == key)
    }

    /// The `DUMP` of `key`, if it was captured.
    pub fn dump(&self, key: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|entry| entry.key == key)
            .map(|entry| entry.dump.as_slice())
    }

    /// How many keys were captured.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key matched the pattern.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
