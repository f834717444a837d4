//! Pieces shared by the consumer and producer SDKs of redis-stream-coord.
//!
//! # Layout
//! * [`version_store`]: the version-store SPI (the highest metadata/routing version a client has observed) with
//!   an in-memory and an atomic-file implementation.
//! * [`coord_client`]: the coordinator HTTP client: several URLs, failover on connection errors and on
//!   `COORDINATOR_TERMINATING`, typed errors.
//! * [`redis_check`]: the start-up check of a Redis server (reachable, recent enough, the needed commands).
#![warn(missing_docs)]

pub mod coord_client;
pub mod redis_check;
pub mod version_store;

pub use coord_client::{CoordClient, CoordError};
pub use version_store::{FileVersionStore, MemoryVersionStore, VersionStore, VersionStoreError};
