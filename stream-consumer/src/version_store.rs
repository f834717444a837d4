//! The version-store SPI, shared with the producer SDK (defined once in `client_core`, re-exported here).
//!
//! The consumer keeps the highest group metadata version it has ever observed under the key
//! `"<stream>/<group>"` ([`version_key`]). It loads it once at start and stores it only when it grows. The
//! default is [`MemoryVersionStore`] (process lifetime); [`FileVersionStore`] keeps it across restarts, so a
//! restarted process still reports the version it saw before, and the coordinator notices a Redis rollback
//! that happened while the process was down. A custom store (a database row, a config service) implements
//! [`VersionStore`]; see `examples/custom_version_store.rs`.

pub use client_core::{FileVersionStore, MemoryVersionStore, VersionStore, VersionStoreError};
use futures::future::BoxFuture;
use protocol::names::{GroupName, StreamName};

/// The key under which the consumer of `group` on `stream` keeps its highest observed metadata version.
pub fn version_key(stream: &StreamName, group: &GroupName) -> String {
    format!("{stream}/{group}")
}

/// Object-safe form of [`VersionStore`] (whose methods return `impl Future`), so the consumer is not generic
/// over the store.
pub(crate) trait DynVersionStore: Send + Sync {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, VersionStoreError>>;
    fn store<'a>(&'a self, key: &'a str, version: u64) -> BoxFuture<'a, Result<(), VersionStoreError>>;
}

impl<S: VersionStore> DynVersionStore for S {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, VersionStoreError>> {
        Box::pin(VersionStore::load(self, key))
    }

    fn store<'a>(&'a self, key: &'a str, version: u64) -> BoxFuture<'a, Result<(), VersionStoreError>> {
        Box::pin(VersionStore::store(self, key, version))
    }
}
