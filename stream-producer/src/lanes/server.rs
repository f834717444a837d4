//! The lanes to one server: a fixed number of them, shard `s` always on lane `s % lanes` (so the pipelines of one
//! shard are written in the order they were issued), every request followed by `WAIT` when the producer is
//! durable ([`Durable`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use protocol::ShardId;
use redis::RedisResult;
use redis::Value;

use super::durable::{Durable, Replication, WAIT_REQUIREMENTS};
use super::gate::{AclProbes, ConnectFailure, PathCommands, RedisGate};
use super::lane::{cmd_outcomes, CmdOutcome, InFlightGuard, Lane, LaneTimeouts};
use crate::config::ProducerConfig;
use crate::error::ConfigError;
use crate::stats::Stats;

/// The lanes to one Redis server, and the `WAIT` behind every request when durable.
pub(crate) struct ServerLanes {
    lanes: Vec<Lane>,
    /// The `WAIT` behind every write, when durable.
    durable: Option<Durable>,
    /// Counts the pipelines sent and in flight.
    stats: Arc<Stats>,
}

impl ServerLanes {
    /// The lanes to the server of `config.redis_url` (none opened yet). `preload_script`: every new connection
    /// loads the publish script (the idempotent producer's path).
    ///
    /// # Errors
    /// A Redis URL redis-rs cannot read.
    pub(crate) fn new(config: &ProducerConfig, stats: Arc<Stats>, preload_script: bool) -> Result<Self, ConfigError> {
        let tls = config.load_redis_tls()?;
        let client =
            redis_link::tls_client(&config.redis_url, tls.as_ref()).map_err(|source| ConfigError::InvalidRedisUrl {
                url: protocol::redact::redact_url(&config.redis_url),
                source,
            })?;
        let durable = Durable::of(config);
        // A durable producer's check of the server covers `WAIT` too.
        let also = durable.as_ref().map(|_| &WAIT_REQUIREMENTS);
        let path = match (preload_script, config.fencing) {
            (true, _) => PathCommands::Script,
            (false, true) => PathCommands::Transaction,
            (false, false) => PathCommands::Plain,
        };
        let probes = Arc::new(AclProbes::of(config, path));
        let gate = Arc::new(RedisGate::new(config.redis_url.clone(), also, probes));
        let timeouts = LaneTimeouts::of(config);
        let lanes = (0..config.connections)
            .map(|_| Lane::new(gate.clone(), client.clone(), tls.clone(), timeouts, preload_script))
            .collect();
        Ok(ServerLanes { lanes, durable, stats })
    }

    /// Which lane carries `shard`'s pipelines.
    pub(crate) fn index_of(&self, shard: ShardId) -> usize {
        shard.index() % self.lanes.len()
    }

    /// How many lanes there are.
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Lane `index` (see [`index_of`](Self::index_of)).
    pub(crate) fn lane(&self, index: usize) -> &Lane {
        &self.lanes[index]
    }

    /// The counters the lanes' requests update.
    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Opens every lane's connection now.
    ///
    /// # Errors
    /// The first connection error.
    pub(crate) async fn connect_all(&self) -> Result<(), ConnectFailure> {
        for lane in &self.lanes {
            lane.connection().await?;
        }
        Ok(())
    }

    /// Sends one shard's pipeline (no ignored commands: one reply each) to its lane, followed by `WAIT` when
    /// durable. One outcome per command, except when the server answered with another number of replies; and
    /// what the `WAIT` confirmed.
    pub(crate) async fn send(&self, shard: ShardId, pipe: &redis::Pipeline) -> (Vec<CmdOutcome>, Replication) {
        self.stats.pipelines.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlightGuard::enter(&self.stats.pipelines_in_flight);
        let lane = self.lane(self.index_of(shard));
        let count = pipe.len();
        let Some(durable) = &self.durable else {
            return (cmd_outcomes(lane.run(pipe).await, count), Replication::Confirmed);
        };
        let parts = vec![Bytes::from(pipe.get_packed_pipeline()), durable.packed()];
        let mut outcomes = cmd_outcomes(lane.run_packed(parts, count + 1).await, count + 1);
        let replication = durable.split(&mut outcomes, count);
        (outcomes, replication)
    }

    /// Sends `count` RESP-encoded commands of one shard to its lane, followed by `WAIT` when durable.
    pub(crate) async fn send_packed(
        &self,
        shard: ShardId,
        commands: Bytes,
        count: usize,
    ) -> (Vec<CmdOutcome>, Replication) {
        self.stats.pipelines.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlightGuard::enter(&self.stats.pipelines_in_flight);
        let lane = self.lane(self.index_of(shard));
        let Some(durable) = &self.durable else {
            return (
                cmd_outcomes(lane.run_packed(vec![commands], count).await, count),
                Replication::Confirmed,
            );
        };
        let parts = vec![commands, durable.packed()];
        let mut outcomes = cmd_outcomes(lane.run_packed(parts, count + 1).await, count + 1);
        let replication = durable.split(&mut outcomes, count);
        (outcomes, replication)
    }

    /// Appends `WAIT` behind a checked transaction's `EXEC` when durable; answers how many replies that adds.
    pub(crate) fn wait_behind(&self, parts: &mut Vec<Bytes>) -> usize {
        match &self.durable {
            Some(durable) => {
                parts.push(durable.packed());
                1
            }
            None => 0,
        }
    }

    /// Takes the reply of the `WAIT` [`wait_behind`](Self::wait_behind) appended (`waits` of them: 0 or 1) off the
    /// end of `replies`.
    pub(crate) fn wait_reply(&self, replies: &mut Vec<RedisResult<Value>>, waits: usize) -> Replication {
        match &self.durable {
            Some(durable) if waits > 0 => durable.read_outcome(replies.pop().map(CmdOutcome::Reply)),
            _ => Replication::Confirmed,
        }
    }
}
