//! Pieces shared by the consumer and producer SDKs of redis-stream-coord.
//!
//! # Layout
//! * [`admin`]: the coordinator's admin API client (groups, routing, shards, fencing), typed errors.
//! * [`version_store`]: the version-store SPI (the highest metadata/routing version a client has observed) with
//!   an in-memory and an atomic-file implementation.
//! * [`persist`]: persisting the highest observed version, retried until the store takes it, with the policy
//!   for what a client does while its store fails.
//! * [`config_error`]: [`ConfigError`], the configuration errors of both SDKs (one vocabulary).
//! * [`redis_check`]: the Redis version and command check a client runs on its own Redis connection.
//! * [`membership`]: the client's membership rules (epoch, versions, per-shard reading / draining / revoked
//!   state) built from coordinator answers; pure, driven by the consumer SDK and by every test model.
//! * [`coord_tls`]: TLS to the coordinator (`https://`): the rustls configuration of a `redis_link::TlsOptions`
//!   and the classification of a failed handshake as final.
//! * [`lease`]: the assignment lease counted from the heartbeat's send time; pure and time-generic.
//! * [`metrics`]: the metric handles both SDKs record through (the `metrics` facade, or no-op stand-ins).
//! * [`coord_client`]: the coordinator HTTP client: several URLs, failover on connection errors and on
//!   `COORDINATOR_TERMINATING`, typed errors; and [`CoordTransport`], the calls the SDKs' drivers make, with the
//!   HTTP client as its implementation (and an in-memory one in `testing`, feature `test-util`).
#![warn(missing_docs)]

pub mod admin;
pub mod config_error;
pub mod coord_client;
pub mod coord_tls;
pub mod lease;
pub mod membership;
pub mod metrics;
pub mod persist;
pub mod redis_check;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod version_store;

pub use config_error::ConfigError;
pub use coord_client::{CoordClient, CoordError, CoordFuture, CoordTransport};
pub use coord_tls::{HttpClientError, TlsConfigError};
pub use persist::{PersistObserver, PersistPolicy, VersionPersister};
pub use redis_check::{
    check_permissions, check_redis, redact_url, Incompatibility, PermissionProbe, RedisCapabilities, RedisCheckError,
    RedisRequirements,
};
/// The TLS settings of every connection (`redis_link::TlsOptions`), re-exported for the coordinator clients.
pub use redis_link::TlsOptions;
pub use version_store::{
    FileVersionStore, MemoryVersionStore, ObservedVersion, SharedVersionStore, VersionStore, VersionStoreError,
};
