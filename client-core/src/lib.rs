//! Pieces shared by the consumer and producer SDKs of redis-stream-coord.
//!
//! # Layout
//! * [`version_store`]: the version-store SPI (the highest metadata/routing version a client has observed) with
//!   an in-memory and an atomic-file implementation.
//! * [`persist`]: persisting the highest observed version, retried until the store takes it, with the policy
//!   for what a client does while its store fails.
//! * [`redis_check`]: the Redis version and command check a client runs on its own Redis connection.
//! * [`metrics`]: the metric handles both SDKs record through (the `metrics` facade, or no-op stand-ins).
//! * [`coord_client`]: the coordinator HTTP client: several URLs, failover on connection errors and on
//!   `COORDINATOR_TERMINATING`, typed errors.
#![warn(missing_docs)]

pub mod coord_client;
pub mod metrics;
pub mod persist;
pub mod redis_check;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod version_store;

pub use coord_client::{CoordClient, CoordError};
pub use persist::{PersistObserver, PersistPolicy, VersionPersister};
pub use redis_check::{check_redis, redact_url, RedisCapabilities, RedisCheckError, RedisRequirements};
pub use version_store::{
    FileVersionStore, MemoryVersionStore, ObservedVersion, SharedVersionStore, VersionStore, VersionStoreError,
};
