//! Where the write paths send: the *lanes*, pipelining connections each shared by every request given to it.
//!
//! * [`ServerLanes`] (`server.rs`): a fixed number of lanes to one server; shard `s` always on lane `s % lanes`.
//! * The cluster route (`cluster.rs`): per-node lanes, and a shard's pipeline sent straight to the master of its
//!   key's slot with every redirect followed per command. [`Route::Cluster`] wraps it.
//! * `lane.rs`: one lane (connected lazily, single flight; replaced after a transport error) and what one command
//!   sent on it came to ([`CmdOutcome`]); `gate.rs`: the Redis check a server (or node) takes before its first
//!   connection is used; `durable.rs`: the `WAIT` behind every request of a durable producer.
//!
//! # Redis Cluster
//! With a `cluster:` target the lanes are per node: each master gets `connections` lanes of its own (opened on
//! first use, checked and given the publish script like any lane), and a shard's pipeline goes straight to the
//! master of its key's slot, on lane `s % connections` of that master. redis-rs's cluster connection is not used
//! for writes: on a redirect it re-sends a whole pipeline, re-running the commands that had run. Instead every
//! reply is read on its own: a normal reply settles its command; `MOVED` and `ASK` say the command did not run,
//! and the redirected commands (only those, in their order) are sent again to the named node (`ASK`: each
//! preceded by `ASKING`; `MOVED`: the slot map is refreshed too); `TRYAGAIN` and `CLUSTERDOWN` are sent again
//! after a short backoff. A call follows at most [`cluster::MAX_REDIRECTS`] redirects in a row and retries until
//! one response timeout after it started; past that its unsettled commands fail as not written
//! ([`PublishError::ClusterUnsettled`](crate::error::PublishError::ClusterUnsettled)). A node that cannot be
//! reached is retried the same way (after a slot map refresh: a failover may have moved its slots). A connection
//! that fails after sending leaves its commands unknown, as on one server. The pipelines of one shard still settle
//! in issue order: a pipeline handles its redirects only after the shard's previous pipeline settled; a new
//! pipeline is sent right after the shard's previous one was handed to the same node (one lane keeps their order),
//! and waits for it to settle when it went to another node (the slot map changed meanwhile) or while one of the
//! shard's pipelines is settling redirects.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use protocol::names::StreamName;
use protocol::ShardId;

use crate::config::ProducerConfig;
use crate::error::ConfigError;
use crate::stats::Stats;

mod cluster;
mod durable;
mod gate;
mod lane;
mod server;

pub(crate) use durable::{Durable, Replication};
pub(crate) use gate::ConnectFailure;
pub use gate::REDIS_REQUIREMENTS;
use gate::{AclProbes, PathCommands};
pub(crate) use lane::{reply_of, CmdOutcome, InFlightGuard, Lane, LaneTimeouts};
pub(crate) use server::ServerLanes;

/// Where a shard's pipelines go: the lanes of one server, or the master of the shard's slot on a Redis Cluster.
/// Chosen once, from the producer's Redis target.
pub(crate) enum Route {
    /// One server.
    Server(ServerLanes),
    /// A Redis Cluster.
    Cluster(ClusterLanes),
}

impl Route {
    /// Sends one shard's pipeline (no ignored commands), followed by `WAIT` when durable. One outcome per command,
    /// except when a single server answered with another number of replies; and what the `WAIT` confirmed.
    pub(crate) async fn send(&self, shard: ShardId, pipe: &redis::Pipeline) -> (Vec<CmdOutcome>, Replication) {
        match self {
            Route::Server(lanes) => lanes.send(shard, pipe).await,
            Route::Cluster(cluster) => cluster.send(shard, pipe).await,
        }
    }

    /// Opens every lane's connection now (on a cluster: of every master).
    ///
    /// # Errors
    /// The first connection error.
    pub(crate) async fn connect_all(&self) -> Result<(), ConnectFailure> {
        match self {
            Route::Server(lanes) => lanes.connect_all().await,
            Route::Cluster(cluster) => cluster.connect_all().await,
        }
    }
}

/// The cluster route of one producer, with what its requests need: the stream (a shard's slot), the `WAIT` when
/// durable and the counters.
pub(crate) struct ClusterLanes {
    /// Boxed: it is large, and a [`Route`] is one server's lanes more often.
    route: Box<cluster::ClusterRoute>,
    stream: StreamName,
    durable: Option<Durable>,
    stats: Arc<Stats>,
}

impl ClusterLanes {
    /// The route to the Redis Cluster these seed URLs reach (nothing opened yet). `preload_script`: every new
    /// node connection loads the publish script.
    ///
    /// # Errors
    /// A seed that is not a TCP `redis://` / `rediss://` URL.
    pub(crate) fn new(
        config: &ProducerConfig,
        seeds: &[String],
        stats: Arc<Stats>,
        preload_script: bool,
    ) -> Result<Self, ConfigError> {
        let tls = config.load_redis_tls()?;
        let mut route = cluster::ClusterRoute::new(seeds, tls.as_ref(), LaneTimeouts::of(config), config.connections)
            .map_err(|source| ConfigError::InvalidRedisUrl {
            url: protocol::redact::redact_url(&config.redis_url),
            source,
        })?;
        let durable = Durable::of(config);
        route.preload_script = preload_script;
        // A durable producer's check of every node covers `WAIT` too.
        route.also_require = durable.as_ref().map(|_| &durable::WAIT_REQUIREMENTS);
        let path = if preload_script {
            PathCommands::Script
        } else {
            PathCommands::Plain
        };
        route.probes = Arc::new(AclProbes::of(config, path));
        Ok(ClusterLanes {
            route: Box::new(route),
            stream: config.stream.clone(),
            durable,
            stats,
        })
    }

    /// Reads the slot map and opens every lane of every master.
    ///
    /// # Errors
    /// The first connection error.
    pub(crate) async fn connect_all(&self) -> Result<(), ConnectFailure> {
        self.route.connect_all().await
    }

    /// Sends one shard's pipeline to the master of its slot, following redirects (see the module docs).
    pub(crate) async fn send(&self, shard: ShardId, pipe: &redis::Pipeline) -> (Vec<CmdOutcome>, Replication) {
        self.stats.pipelines.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlightGuard::enter(&self.stats.pipelines_in_flight);
        self.route
            .run(&self.stats, &self.stream, shard, pipe, self.durable.as_ref())
            .await
    }
}
