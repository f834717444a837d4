//! Test doubles for the SDKs' tests (feature `test-util`; not for production use).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::version_store::{MemoryVersionStore, VersionStore, VersionStoreError};

/// A version store whose writes fail on demand: the first `n` writes ([`Self::failing_first`]), or every write
/// while it is switched off ([`Self::set_failing`]). Reads and successful writes go to an in-memory store.
/// Clones share their state, so a test keeps one to control the store it gave a client.
#[derive(Debug, Clone, Default)]
pub struct FailingVersionStore {
    inner: MemoryVersionStore,
    failing: Arc<AtomicBool>,
    fail_next: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl FailingVersionStore {
    /// A store whose first `n` writes fail.
    pub fn failing_first(n: u64) -> Self {
        let s = FailingVersionStore::default();
        s.fail_next.store(n, Ordering::Relaxed);
        s
    }

    /// Makes every write fail (`true`) or succeed (`false`, once the first-`n` failures are used up).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// Writes that failed so far.
    pub fn failed_writes(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// What the store holds for `key` (0: nothing).
    pub async fn stored(&self, key: &str) -> u64 {
        self.inner.load(key).await.unwrap_or(0)
    }
}

impl VersionStore for FailingVersionStore {
    async fn load(&self, key: &str) -> Result<u64, VersionStoreError> {
        self.inner.load(key).await
    }

    async fn store(&self, key: &str, version: u64) -> Result<(), VersionStoreError> {
        let scheduled = self
            .fail_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if scheduled || self.failing.load(Ordering::Relaxed) {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(VersionStoreError::other("injected version-store failure"));
        }
        self.inner.store(key, version).await
    }
}
