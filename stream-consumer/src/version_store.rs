//! The version-store SPI, shared with the producer SDK (defined once in `client_core`, re-exported here).
//!
//! The consumer keeps the highest group metadata version it has ever observed under the key
//! `"<stream>/<group>"` ([`version_key`]). It loads it once at start and stores it every time it grows, retrying
//! a failed write until it succeeds ([`client_core::persist`]: the consumer keeps reading within its lease
//! meanwhile, and says so in a `warn` log and the `redis_stream_consumer_version_store_failures_total` /
//! `redis_stream_consumer_version_unpersisted` metrics). The default is the process-wide
//! [`MemoryVersionStore::process`], shared by every consumer and producer of the process, so a consumer
//! recreated in the same process still reports what an earlier one saw; [`FileVersionStore`] keeps it across
//! restarts, so a
//! restarted process still reports the version it saw before, and the coordinator notices a Redis rollback
//! that happened while the process was down. A custom store (a database row, a config service) implements
//! [`VersionStore`]; see `examples/custom_version_store.rs`.

pub(crate) use client_core::SharedVersionStore;
pub use client_core::{FileVersionStore, MemoryVersionStore, VersionStore, VersionStoreError};
use protocol::names::{GroupName, StreamName};

/// The key under which the consumer of `group` on `stream` keeps its highest observed metadata version.
pub fn version_key(stream: &StreamName, group: &GroupName) -> String {
    format!("{stream}/{group}")
}
