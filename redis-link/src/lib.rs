//! How the redis-stream-coord components reach Redis: one server, or a Redis Cluster.
//!
//! - [`RedisTarget`] is the configuration: one `redis://` URL, or `cluster:` followed by the comma-separated URLs
//!   of some of a cluster's nodes (seeds; the rest are discovered).
//! - [`Connection`] is the shared connection of the coordinator and the consumer: redis-rs's
//!   `ConnectionManager` for one server, its async cluster connection for a cluster (which routes every keyed
//!   command and single-slot pipeline to its slot's master and follows `MOVED`, `ASK` and failovers). It is
//!   for commands that are harmless to repeat: on a redirect or a lost connection redis-rs re-sends.
//! - [`ClusterRouter`] owns Cluster routing for the producer, the consumer and the coordinator, for what
//!   redis-rs's cluster connection does not do exactly enough: the topology and the slot map (read on first use,
//!   refreshed after `MOVED`, a failover or a lost node), per-node connections and a per-node value of the
//!   caller's (the producer's lanes), and
//!   - [`ClusterRouter::run_pipeline`]: a pipeline of one slot on its master, each command's `MOVED` (with a
//!     map refresh), `ASK` (with `ASKING`), `TRYAGAIN` and `CLUSTERDOWN` followed on its own, with a backoff and
//!     within a [`RetryPolicy`]. A command is sent again only when its own reply says it did not run, or when it
//!     was never sent; a connection that fails after sending leaves it [`CommandOutcome::Lost`]. The caller
//!     sends each request ([`PipelineDriver`]) and keeps its own order between pipelines;
//!   - [`ClusterRouter::on_each_master`], [`ClusterRouter::each_master`]: node-local questions (`INFO`, `TIME`,
//!     `SCAN`), each answer with its node;
//!   - [`ClusterRouter::read_many`]: read-only commands over many slots, one pipeline per master, redirected
//!     ones asked again;
//!   - [`Nodes`] and [`KeyRoute`]: the dedicated connection of a blocking read of one key (the consumer's
//!     `XREADGROUP BLOCK`), on the key's master, moved after `MOVED` / `ASK` / a lost connection (a blocked read
//!     is ended by closing its connection).
//!
//!   [`SlotMap`], [`NodePool`] and [`Redirect`] are its parts: the map, the node connections, and the reading
//!   of `MOVED` / `ASK` replies.
//! - [`PipelinedConnection`] and [`resp`] are for pipelines of thousands of commands (the producer's writes):
//!   commands written as RESP into one buffer and replies read by a small parser, without redis-rs's per-command
//!   objects.
//!
//! # Layout
//! `target.rs` (the configuration), `connection.rs` (the shared connection), `router.rs` (the router and its
//! per-node values), `resend.rs` (a pipeline's redirects, per command), `fan_out.rs` (every master; reads over
//! many slots), `nodes.rs` (dedicated connections of blocking reads), `topology.rs` (the slot map),
//! `node_pool.rs` (node connections), `redirect.rs` (`MOVED` / `ASK`), `pipelined.rs` and `resp.rs` (the RESP
//! pipelining connection), `tls.rs` (TLS settings of every connection),
//! `tls_setup.rs` (the settings loaded: the rustls configuration and redis-rs's certificates, built once),
//! `tls_failure.rs` (a failed handshake's cause in words).

mod connection;
mod fan_out;
mod node_pool;
mod nodes;
mod pipelined;
mod redirect;
mod resend;
pub mod resp;
mod router;
mod target;
mod tls;
mod tls_failure;
mod tls_setup;
mod topology;

pub use connection::Connection;
pub use fan_out::MastersError;
pub use node_pool::NodePool;
pub use nodes::{KeyRoute, Nodes, Route};
pub use pipelined::PipelinedConnection;
pub use redirect::{Redirect, RedirectKind};
pub use resend::{
    CommandOutcome, NodeRequest, PipelineDriver, ReplyKind, Resends, RetryPolicy, SendError, BACKOFF_MAX, BACKOFF_MIN,
    MAX_REDIRECTS,
};
pub use router::ClusterRouter;
pub use target::{RedisTarget, TargetError, MAX_SEEDS};
pub use tls::TlsOptions;
pub use tls_failure::{explain as explain_connect_error, TlsFailure};
pub use tls_setup::{client as tls_client, cluster_builder, connection_info, is_tls_url, RedisTls, TlsError};
pub use topology::{NodeAddr, SlotMap, TopologyError};
