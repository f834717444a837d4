//! The version-store SPI: where a client keeps the highest version it has ever observed.
//!
//! Redis can lose recent writes. A client that remembers a version above what Redis now stores is how the
//! coordinator learns of the loss (and starts a correction round). The in-memory store remembers for the life of
//! the process; a deployment that wants a restarted process to detect a rollback too plugs in a persistent store:
//! [`FileVersionStore`], or its own implementation of [`VersionStore`] (a database row, a config service, ...).
//!
//! # One memory per process
//! The seed asks every client to remember the highest version it saw *for the lifetime of the process*, not of
//! one `Consumer` or `Producer` object: a client recreated in the same process (a reconnect loop, a
//! reconfiguration) must not start again at 0, or a rollback that happened in between goes unnoticed. So the
//! SDKs' default is [`MemoryVersionStore::process`], one store shared by every client of the process, keyed
//! like any store (`"<stream>/<group>"` for a consumer group's metadata, `"<stream>"` for a stream's routing;
//! stream and group names cannot contain `/`, so the two never collide).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// A version store failed.
///
/// ```
/// use client_core::VersionStoreError;
///
/// // What a custom store returns when its backend fails (a database driver's error, or a message).
/// let e = VersionStoreError::other("row locked");
/// assert!(matches!(e, VersionStoreError::Other(_)));
/// // A value that is not a version is final; the rest may pass.
/// let retry_later = !matches!(e, VersionStoreError::Corrupt(_));
/// assert!(retry_later);
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VersionStoreError {
    /// Reading or writing the backing storage failed.
    #[error("version store I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The stored value is not a version.
    #[error("version store holds an unreadable value: {0:?}")]
    Corrupt(String),
    /// A user implementation's own error (build it with [`VersionStoreError::other`]).
    #[error("version store: {0}")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A write did not finish within its deadline (see [`crate::persist::PersistPolicy`]).
    #[error("version store write timed out after {0:?}")]
    TimedOut(std::time::Duration),
}

impl VersionStoreError {
    /// Wraps an implementation's own error (a database driver's, say), or a message (`&str` and `String`
    /// convert too), keeping it as the [`source`](std::error::Error::source).
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        VersionStoreError::Other(error.into())
    }
}

/// Keeps the highest version a client has observed, per key (for example `orders/billing` for a consumer
/// group's metadata, or `orders` for a stream's routing).
///
/// Implementations must be monotonic: `store` of a lower value than the stored one keeps the higher one.
/// The SDKs call `load` once at start and `store` only when the observed maximum grows, off the hot path.
///
/// A store of one's own (a database row, a config service); this one keeps a map, as a stand-in:
/// ```
/// use client_core::{VersionStore, VersionStoreError};
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// #[derive(Default)]
/// struct MapStore(Mutex<HashMap<String, u64>>);
///
/// impl VersionStore for MapStore {
///     async fn load(&self, key: &str) -> Result<u64, VersionStoreError> {
///         let map = self.0.lock().map_err(|_| VersionStoreError::other("poisoned"))?;
///         Ok(map.get(key).copied().unwrap_or(0))
///     }
///
///     async fn store(&self, key: &str, version: u64) -> Result<(), VersionStoreError> {
///         let mut map = self.0.lock().map_err(|_| VersionStoreError::other("poisoned"))?;
///         let stored = map.entry(key.to_owned()).or_insert(0);
///         *stored = (*stored).max(version); // monotonic: a lower version keeps the higher one
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), VersionStoreError> {
/// let store = MapStore::default();
/// store.store("orders/billing", 7).await?;
/// store.store("orders/billing", 5).await?;
/// assert_eq!(store.load("orders/billing").await?, 7);
/// # Ok(())
/// # }
/// ```
/// Give it to a consumer with `ConsumerBuilder::version_store`, to a producer with `ProducerBuilder::version_store`.
pub trait VersionStore: Send + Sync + 'static {
    /// The highest version stored for `key`, 0 when none.
    fn load(&self, key: &str) -> impl Future<Output = Result<u64, VersionStoreError>> + Send;
    /// Records `version` for `key` if it is higher than the stored one.
    fn store(&self, key: &str, version: u64) -> impl Future<Output = Result<(), VersionStoreError>> + Send;
}

/// Remembers versions in memory. [`MemoryVersionStore::process`] is the SDKs' default: one store for the whole
/// process; [`MemoryVersionStore::new`] makes a separate one (tests, or clients that must not share).
///
/// ```
/// use client_core::{MemoryVersionStore, VersionStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), client_core::VersionStoreError> {
/// let store = MemoryVersionStore::new();
/// store.store("orders", 3).await?;
/// // Clones share the versions; `MemoryVersionStore::process()` is the one store of the whole process.
/// assert_eq!(store.clone().load("orders").await?, 3);
/// assert_eq!(store.load("payments").await?, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryVersionStore {
    versions: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<AtomicU64>>>>,
}

impl MemoryVersionStore {
    /// An empty store of its own, shared only by its clones.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide store: every call returns a handle to the same memory, so every consumer and producer
    /// of the process that uses the default sees the highest version any of them observed.
    pub fn process() -> Self {
        static PROCESS: std::sync::OnceLock<MemoryVersionStore> = std::sync::OnceLock::new();
        PROCESS.get_or_init(MemoryVersionStore::new).clone()
    }

    fn slot(&self, key: &str) -> Arc<AtomicU64> {
        let mut map = self
            .versions
            .lock()
            .expect("version map lock is never held across a panic");
        map.entry(key.to_owned()).or_default().clone()
    }
}

/// The highest version observed under one key by the clients sharing a store, readable with one atomic load
/// (cheap enough for a publish path); see [`SharedVersionStore::observed`].
#[derive(Debug, Clone)]
pub struct ObservedVersion(Arc<AtomicU64>);

impl ObservedVersion {
    /// The highest version observed so far (0: none).
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Raises the slot to `version` (never lowers it); returns the previous value.
    pub fn raise(&self, version: u64) -> u64 {
        self.0.fetch_max(version, Ordering::AcqRel)
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

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`VersionStore`] is not object safe (it returns `impl Future`); this erases it so the SDKs are not generic
/// over their store.
trait ErasedVersionStore: Send + Sync {
    fn erased_load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, VersionStoreError>>;
    fn erased_store<'a>(&'a self, key: &'a str, version: u64) -> BoxFuture<'a, Result<(), VersionStoreError>>;
}

impl<S: VersionStore> ErasedVersionStore for S {
    fn erased_load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, VersionStoreError>> {
        Box::pin(VersionStore::load(self, key))
    }

    fn erased_store<'a>(&'a self, key: &'a str, version: u64) -> BoxFuture<'a, Result<(), VersionStoreError>> {
        Box::pin(VersionStore::store(self, key, version))
    }
}

/// Any [`VersionStore`], type-erased and cheap to clone (what the SDKs hold).
#[derive(Clone)]
pub struct SharedVersionStore {
    store: Arc<dyn ErasedVersionStore>,
    /// What the clients of this store observed, readable without an await (see [`Self::observed`]).
    observed: MemoryVersionStore,
}

impl SharedVersionStore {
    /// Wraps `store`.
    pub fn new<S: VersionStore>(store: S) -> Self {
        // A memory store *is* the observation memory: every client given (a clone of) it sees what the others
        // observed, the process-wide one included. Other stores get a memory of their own.
        let observed = (&store as &dyn std::any::Any)
            .downcast_ref::<MemoryVersionStore>()
            .cloned()
            .unwrap_or_default();
        SharedVersionStore {
            store: Arc::new(store),
            observed,
        }
    }

    /// The live highest version observed under `key` by the clients sharing this store's memory: with the
    /// default ([`Self::process_default`]) every consumer and producer of the process. A client raises it with
    /// what it observes and reads it to learn what the others saw (for example a producer learns of a newer
    /// routing from a consumer's heartbeat answer).
    pub fn observed(&self, key: &str) -> ObservedVersion {
        ObservedVersion(self.observed.slot(key))
    }

    /// The SDKs' default: the process-wide [`MemoryVersionStore::process`].
    pub fn process_default() -> Self {
        SharedVersionStore::new(MemoryVersionStore::process())
    }

    /// See [`VersionStore::load`].
    ///
    /// # Errors
    /// The store's error.
    pub async fn load(&self, key: &str) -> Result<u64, VersionStoreError> {
        self.store.erased_load(key).await
    }

    /// See [`VersionStore::store`].
    ///
    /// # Errors
    /// The store's error.
    pub async fn store(&self, key: &str, version: u64) -> Result<(), VersionStoreError> {
        self.store.erased_store(key, version).await
    }
}

impl std::fmt::Debug for SharedVersionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedVersionStore")
    }
}

/// Keeps each key's version in a small file in a directory, written atomically (temp file, fsync, rename, fsync
/// of the directory), so a restarted process still knows the highest version it saw before.
///
/// ```
/// use client_core::{FileVersionStore, VersionStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), client_core::VersionStoreError> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path();
/// // `dir`: a directory that outlives the process (a persistent volume).
/// let store = FileVersionStore::new(dir)?;
/// store.store("orders", 12).await?;
/// // A restarted process reads what the last one stored.
/// assert_eq!(FileVersionStore::new(dir)?.load("orders").await?, 12);
/// # Ok(())
/// # }
/// ```
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
        .map_err(VersionStoreError::other)??;
        Ok(())
    }
}

/// The key under which a consumer of `group` on `stream` keeps its highest observed group metadata version
/// (`"<stream>/<group>"`; re-exported as `stream_consumer::version_store::version_key`).
///
/// ```
/// use client_core::version_store::group_version_key;
/// use protocol::names::{GroupName, StreamName};
///
/// let key = group_version_key(&StreamName::new("orders")?, &GroupName::new("billing")?);
/// assert_eq!(key, "orders/billing");
/// # Ok::<(), protocol::NameError>(())
/// ```
pub fn group_version_key(stream: &protocol::names::StreamName, group: &protocol::names::GroupName) -> String {
    format!("{stream}/{group}")
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
    async fn the_process_store_is_one_memory_for_every_handle() {
        let key = "process-store-test/group";
        MemoryVersionStore::process().store(key, 7).await.unwrap();
        assert_eq!(MemoryVersionStore::process().load(key).await.unwrap(), 7);
        assert_eq!(SharedVersionStore::process_default().load(key).await.unwrap(), 7);
        assert_eq!(
            MemoryVersionStore::new().load(key).await.unwrap(),
            0,
            "new() is a store of its own"
        );
        let shared = SharedVersionStore::process_default();
        assert_eq!(
            shared.observed(key).get(),
            7,
            "the observation memory is the store's memory"
        );
        shared.observed(key).raise(8);
        assert_eq!(MemoryVersionStore::process().load(key).await.unwrap(), 8);
        let file_dir = tempfile::tempdir().unwrap();
        let file = SharedVersionStore::new(FileVersionStore::new(file_dir.path()).unwrap());
        assert_eq!(file.observed(key).get(), 0, "another store has a memory of its own");
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

    #[test]
    fn an_implementations_error_stays_the_source() {
        use std::error::Error as _;
        let e = VersionStoreError::other(std::io::Error::other("row locked"));
        assert_eq!(e.source().map(|s| s.to_string()).as_deref(), Some("row locked"));
        assert_eq!(e.to_string(), "version store: row locked");
        let text = VersionStoreError::other("plain message");
        assert_eq!(text.to_string(), "version store: plain message");
    }

    #[tokio::test]
    async fn corrupt_file_is_an_error_not_zero() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("k.version"), "garbage").unwrap();
        let s = FileVersionStore::new(dir.path()).unwrap();
        assert!(matches!(s.load("k").await, Err(VersionStoreError::Corrupt(_))));
    }
}
