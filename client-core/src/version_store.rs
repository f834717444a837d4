//! The version-store SPI: where a client keeps the highest version it has ever observed.
//!
//! Redis can lose recent writes. A client that remembers a version above what Redis now stores is how the
//! coordinator learns of the loss (and starts a correction round). The in-memory store remembers for the life of
//! the process; a deployment that wants a restarted process to detect a rollback too plugs in a persistent store:
//! [`FileVersionStore`], or its own implementation of [`VersionStore`] (a database row, a config service, ...).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// A version store failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VersionStoreError {
    /// Reading or writing the backing storage failed.
    #[error("version store I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The stored value is not a version.
    #[error("version store holds an unreadable value: {0:?}")]
    Corrupt(String),
    /// A user implementation's own error.
    #[error("version store: {0}")]
    Other(String),
}

/// Keeps the highest version a client has observed, per key (for example `orders/billing` for a consumer
/// group's metadata, or `orders` for a stream's routing).
///
/// Implementations must be monotonic: `store` of a lower value than the stored one keeps the higher one.
/// The SDKs call `load` once at start and `store` only when the observed maximum grows, off the hot path.
pub trait VersionStore: Send + Sync + 'static {
    /// The highest version stored for `key`, 0 when none.
    fn load(&self, key: &str) -> impl Future<Output = Result<u64, VersionStoreError>> + Send;
    /// Records `version` for `key` if it is higher than the stored one.
    fn store(&self, key: &str, version: u64) -> impl Future<Output = Result<(), VersionStoreError>> + Send;
}

/// Remembers versions for the life of the process (the default).
#[derive(Debug, Clone, Default)]
pub struct MemoryVersionStore {
    versions: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<AtomicU64>>>>,
}

impl MemoryVersionStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&self, key: &str) -> Arc<AtomicU64> {
        let mut map = self
            .versions
            .lock()
            .expect("version map lock is never held across a panic");
        map.entry(key.to_owned()).or_default().clone()
    }
}

impl VersionStore for MemoryVersionStore {
    async fn load(&self, key: &str) -> Result<u64, VersionStoreError> {
        Ok(self.slot(key).load(Ordering::Acquire))
    }

    async fn store(&self, key: &str, version: u64) -> Result<(), VersionStoreError> {
        self.slot(key).fetch_max(version, Ordering::AcqRel);
        Ok(())
    }
}

/// Keeps each key's version in a small file in a directory, written atomically (temp file, fsync, rename, fsync
/// of the directory), so a restarted process still knows the highest version it saw before.
#[derive(Debug, Clone)]
pub struct FileVersionStore {
    dir: PathBuf,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl FileVersionStore {
    /// A store in `dir` (created if missing).
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self, VersionStoreError> {
        std::fs::create_dir_all(dir.as_ref())?;
        Ok(FileVersionStore {
            dir: dir.as_ref().to_owned(),
            lock: Arc::default(),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        // Keys are stream/group names ([A-Za-z0-9._-]) joined by '/': map the separator to a safe character.
        let name: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '+'
                }
            })
            .collect();
        self.dir.join(format!("{name}.version"))
    }
}

async fn read_version(path: &Path) -> Result<u64, VersionStoreError> {
    match tokio::fs::read_to_string(path).await {
        Ok(text) => text.trim().parse::<u64>().map_err(|_| VersionStoreError::Corrupt(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

impl VersionStore for FileVersionStore {
    async fn load(&self, key: &str) -> Result<u64, VersionStoreError> {
        read_version(&self.path(key)).await
    }

    async fn store(&self, key: &str, version: u64) -> Result<(), VersionStoreError> {
        let _guard = self.lock.lock().await;
        let path = self.path(key);
        if read_version(&path).await? >= version {
            return Ok(());
        }
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || -> Result<(), std::io::Error> {
            use std::io::Write;
            let tmp = path.with_extension("version.tmp");
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(version.to_string().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            // The rename is durable only once the directory entry is.
            std::fs::File::open(&dir)?.sync_all()?;
            Ok(())
        })
        .await
        .map_err(|e| VersionStoreError::Other(format!("version store task failed: {e}")))??;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_store_is_monotonic_per_key() {
        let s = MemoryVersionStore::new();
        s.store("a", 5).await.unwrap();
        s.store("a", 3).await.unwrap();
        s.store("b", 1).await.unwrap();
        assert_eq!(s.load("a").await.unwrap(), 5);
        assert_eq!(s.load("b").await.unwrap(), 1);
        assert_eq!(s.load("c").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn file_store_survives_a_new_instance_and_is_monotonic() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileVersionStore::new(dir.path()).unwrap();
        s.store("orders/billing", 9).await.unwrap();
        s.store("orders/billing", 4).await.unwrap();
        let again = FileVersionStore::new(dir.path()).unwrap();
        assert_eq!(again.load("orders/billing").await.unwrap(), 9);
        assert_eq!(again.load("orders").await.unwrap(), 0);
        assert!(
            !dir.path().join("orders+billing.version.tmp").exists(),
            "no temp file left behind"
        );
    }

    #[tokio::test]
    async fn corrupt_file_is_an_error_not_zero() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("k.version"), "garbage").unwrap();
        let s = FileVersionStore::new(dir.path()).unwrap();
        assert!(matches!(s.load("k").await, Err(VersionStoreError::Corrupt(_))));
    }
}
