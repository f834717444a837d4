//! Test harness for redis-stream-coord: real `redis-server` processes on free
//! loopback ports, rollback of keys, primary + replica pairs, a TCP fault proxy
//! and helpers for waiting on conditions.
//!
//! Tests never mock Redis. Every [`RedisServer`] is a real `redis-server`
//! process (found on `PATH`, or at the path in the `REDIS_SERVER_BIN`
//! environment variable) with its own port, data directory and log file. The
//! process is killed when the value is dropped, so a failing test leaves
//! nothing behind.
//!
//! Every panic raised by the harness about a server carries that server's log
//! text, so a failure in CI can be diagnosed from the test output alone.
//!
//! Nothing in this crate relies on a fixed sleep being long enough: readiness,
//! replication and role changes are all polled with a deadline (see
//! [`wait_until`] and [`wait_for`]).
//!
//! # Layout
//!
//! - [`server`] — [`RedisServer`] and its [`RedisServerBuilder`] (persistence,
//!   renamed or disabled commands, replication, extra arguments), kill, graceful
//!   stop, restart on the same port, logs, connections, and the rollback helpers
//!   ([`RedisServer::dump_key`], [`RedisServer::restore_key`],
//!   [`RedisServer::snapshot_keys`], [`RedisServer::restore_snapshot`]); and for
//!   programs (the demo, the benchmarks) [`RedisServerBuilder::try_start`], which finds or provides the binary
//!   (`scripts/ensure-redis.sh`) and returns a [`LaunchError`] saying what is missing.
//! - [`snapshot`] — [`Snapshot`], the point-in-time copy of every key matching
//!   a pattern.
//! - [`replica`] — [`ReplicaPair`], a primary and its replica, with
//!   [`ReplicaPair::wait_replicated`] and [`ReplicaPair::promote_replica`] to
//!   model a failover that loses the writes made after the replication cut.
//! - [`proxy`] — [`FaultProxy`], a TCP forwarder whose [`Mode`] can pass, stall
//!   or reset traffic.
//! - [`wait`] — [`wait_until`] and [`wait_for`], polling with a deadline; [`poll_for`], [`poll_until`] and
//!   [`poll_every`] when the caller handles the deadline itself.
//! - [`port`] — [`free_port`].
//! - [`gate`] — [`Gate`], holding handlers inside their message until the test opens it.
//! - [`streams`] — [`pending_total`], a group's pending entries over its shard streams.
//!
//! # Features
//!
//! Each suite pulls only what it needs:
//!
//! - `timings` — [`timings`]: the short group timings of every suite.
//! - `coordinator` — [`coordinator`]: the coordinator configuration of tests (implies `timings`).
//! - `consumer` — [`consumer`]: a short-timed consumer builder and [`consumer::wait_status`].
//! - `metrics` — [`metrics`]: [`metrics::MemoryRecorder`], an in-memory recorder that never resets.
//! - `history` — [`history`]: the history checker (one member per shard at a time, nothing acknowledged lost,
//!   per-key order).
//! - `cluster` — `cluster`: a local Redis Cluster (`cluster::RedisCluster`: 3 masters, optionally one replica
//!   each) with slot lookup, `kill -9`, `CLUSTER FAILOVER TAKEOVER` and live slot migration, and
//!   `cluster::key_slot`.
//! - `pki` — `pki`: a test CA (`pki::TestCa`) and the server and client certificates it signs, made at run time.
//!
//! # Example
//!
//! ```no_run
//! # async fn example() {
//! use test_support::RedisServer;
//!
//! let server = RedisServer::builder().persistence(true).start().await;
//! let mut con = server.connection().await;
//! let _: () = redis::cmd("SET").arg("k").arg("v").query_async(&mut con).await.unwrap();
//! # }
//! ```

#![warn(missing_docs)]

#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "consumer")]
pub mod consumer;
#[cfg(feature = "coordinator")]
pub mod coordinator;
pub mod gate;
#[cfg(feature = "history")]
pub mod history;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "pki")]
pub mod pki;
pub mod port;
pub mod proxy;
pub mod replica;
pub mod server;
pub mod snapshot;
pub mod streams;
#[cfg(feature = "timings")]
pub mod timings;
pub mod wait;

pub use gate::Gate;
pub use port::free_port;
pub use proxy::{FaultProxy, Mode};
pub use replica::{wait_replicated, ReplicaPair};
pub use server::{
    LaunchError, RedisServer, RedisServerBuilder, INSTALL_HINT, READY_TIMEOUT, RESPONSE_TIMEOUT, SERVER_BIN_ENV,
};
pub use snapshot::Snapshot;
pub use streams::pending_total;
pub use wait::{poll_every, poll_for, poll_until, wait_for, wait_until};
