//! How the redis-stream-coord components reach Redis: one server, or a Redis Cluster.
//!
//! - [`RedisTarget`] is the configuration: one `redis://` URL, or `cluster:` followed by the comma-separated URLs
//!   of some of a cluster's nodes (seeds; the rest are discovered).
//! - [`Connection`] is the shared connection of the coordinator and the consumer: redis-rs's
//!   `ConnectionManager` for one server, its async cluster connection for a cluster (which routes every keyed
//!   command and single-slot pipeline to its slot's master and follows `MOVED`, `ASK` and failovers).
//! - [`SlotMap`] and [`NodePool`] are for what redis-rs's cluster connection does not do exactly enough: a
//!   pipeline whose replies must each be known to have run or not (the producer's writes: the cluster connection
//!   re-sends a whole pipeline when one reply is a redirect, re-running the commands before it), a blocking read
//!   that must own its connection (the consumer's `XREADGROUP BLOCK`), and commands every master must answer
//!   (`SCAN`, start-up checks). They give a direct connection to the master of a slot, and [`Redirect`] reads
//!   the `MOVED` / `ASK` replies that say where to go next.
//! - [`PipelinedConnection`] and [`resp`] are for pipelines of thousands of commands (the producer's writes):
//!   commands written as RESP into one buffer and replies read by a small parser, without redis-rs's per-command
//!   objects.

mod connection;
mod node_pool;
mod pipelined;
mod redirect;
pub mod resp;
mod target;
mod topology;

pub use connection::Connection;
pub use node_pool::NodePool;
pub use pipelined::PipelinedConnection;
pub use redirect::{Redirect, RedirectKind};
pub use target::{RedisTarget, TargetError, MAX_SEEDS};
pub use topology::{NodeAddr, SlotMap, TopologyError};
