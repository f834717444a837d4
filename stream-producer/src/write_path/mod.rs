//! The write paths: how the records of one shard are written. One type per path, one file each, and the path
//! chosen once, when the producer is built ([`WritePath::new`]), from its settings and its Redis target:
//!
//! | path | file | taken when | one shard batch is written as |
//! |---|---|---|---|
//! | [`Fenced`] | `fenced.rs` | fencing on (the default), one server, not idempotent | a checked transaction (`WATCH` the fence, `MULTI`, the `XADD`s, `EXEC`) |
//! | [`Scripted`] | `scripted.rs` | idempotent producer; or fencing on a Redis Cluster | `EVALSHA` of the publish script per call of at most 512 records |
//! | [`Plain`] | `plain.rs` | fencing off, one server | one pipeline of `XADD`s written as RESP |
//! | [`ClusterPipeline`] | `cluster_pipeline.rs` | fencing off, Redis Cluster | one pipeline of `XADD`s to the master of the shard's slot |
//!
//! Each is written whole or not at all and refuses a producer whose routing version is below the shard's fence
//! ([`PublishError::Fenced`]), except the two plain paths, which a reshard cannot fence. What they share: the
//! `XADD` with the producer's trimming (`xadd.rs`), the batch they are given (`batch.rs`), the idempotent
//! producer's sequences (`idempotence.rs`), and the lanes they send on ([`crate::lanes`]).
//!
//! # Why an enum, not a trait
//! The set of paths is closed and known to this crate, and `write` is async and called once per shard batch on
//! the publish path: behind a `dyn` trait every call would box its future. The one `match` on the path is here,
//! so a new path does not compile until it is wired in, and nothing else (the publisher, the batcher, the
//! producer handle) knows which path it drives.

use std::sync::Arc;

use redis_link::RedisTarget;

use crate::config::{ProducerConfig, Trim};
use crate::error::{ConfigError, PublishError};
use crate::lanes::{ClusterLanes, ConnectFailure, Route, ServerLanes};
use crate::published::Published;
use crate::stats::Stats;

mod batch;
mod cluster_pipeline;
mod fenced;
mod idempotence;
mod plain;
mod scripted;
mod xadd;

pub(crate) use batch::ShardBatch;
use cluster_pipeline::ClusterPipeline;
use fenced::Fenced;
use plain::Plain;
use scripted::Scripted;
pub(crate) use xadd::Xadd;

/// The producer's write path, chosen once (see the module docs).
pub(crate) struct WritePath {
    /// The trimming of every `XADD`, whatever the path.
    trim: Option<Trim>,
    path: Path,
}

enum Path {
    Fenced(Fenced),
    Scripted(Scripted),
    Plain(Plain),
    ClusterPipeline(ClusterPipeline),
}

impl WritePath {
    /// The path `config` asks for, over lanes to its Redis (none opened yet).
    ///
    /// # Errors
    /// A Redis URL (or cluster seed) that cannot be used.
    pub(crate) fn new(config: &ProducerConfig, stats: Arc<Stats>) -> Result<Self, ConfigError> {
        let path = match RedisTarget::parse(&config.redis_url)? {
            // A transaction cannot follow redirects command by command: on a cluster the script checks the fence.
            RedisTarget::Cluster(seeds) if config.fencing => {
                let cluster = ClusterLanes::new(config, &seeds, stats, true)?;
                Path::Scripted(Scripted::new(config, Route::Cluster(cluster)))
            }
            RedisTarget::Cluster(seeds) => Path::ClusterPipeline(ClusterPipeline::new(
                config,
                ClusterLanes::new(config, &seeds, stats, false)?,
            )),
            // The idempotent producer keeps the script: its sequence check and remembered ids change atomically with
            // the write.
            _ if config.fencing && config.idempotence.is_some() => Path::Scripted(Scripted::new(
                config,
                Route::Server(ServerLanes::new(config, stats, true)?),
            )),
            _ if config.fencing => Path::Fenced(Fenced::new(config, ServerLanes::new(config, stats, false)?)),
            _ => Path::Plain(Plain::new(config, ServerLanes::new(config, stats, false)?)),
        };
        Ok(WritePath {
            trim: config.trim,
            path,
        })
    }

    /// The trimming of the `XADD`s of a publish call starting now (its `MINID` threshold is taken once per call).
    pub(crate) fn xadd_now(&self) -> Xadd {
        Xadd::now(self.trim)
    }

    /// Writes one shard's records; one result per record, in order.
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense of outcomes: dropping the future after the writes left leaves their records
    /// in an unknown state (they may be written).
    pub(crate) async fn write(&self, batch: &ShardBatch<'_>) -> Vec<Result<Published, PublishError>> {
        match &self.path {
            Path::Fenced(path) => path.write(batch).await,
            Path::Scripted(path) => path.write(batch).await,
            Path::Plain(path) => path.write(batch).await,
            Path::ClusterPipeline(path) => path.write(batch).await,
        }
    }

    /// Opens every connection of the path now (on a cluster: to every master).
    ///
    /// # Errors
    /// The first connection error.
    pub(crate) async fn connect_all(&self) -> Result<(), ConnectFailure> {
        match &self.path {
            Path::Fenced(path) => path.lanes().connect_all().await,
            Path::Scripted(path) => path.route().connect_all().await,
            Path::Plain(path) => path.lanes().connect_all().await,
            Path::ClusterPipeline(path) => path.cluster().connect_all().await,
        }
    }

    /// The idempotent producer's id, when idempotent.
    pub(crate) fn producer_id(&self) -> Option<&str> {
        match &self.path {
            Path::Scripted(path) => path.producer_id(),
            Path::Fenced(_) | Path::Plain(_) | Path::ClusterPipeline(_) => None,
        }
    }

    /// The path's name, for `Debug`.
    fn name(&self) -> &'static str {
        match &self.path {
            Path::Fenced(_) => "checked transaction",
            Path::Scripted(_) => "publish script",
            Path::Plain(_) => "plain pipeline",
            Path::ClusterPipeline(_) => "cluster pipeline",
        }
    }
}

impl std::fmt::Debug for WritePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WritePath")
            .field("path", &self.name())
            .field("trim", &self.trim)
            .field("producer_id", &self.producer_id())
            .finish()
    }
}
