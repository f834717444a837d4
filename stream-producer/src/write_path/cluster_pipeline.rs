//! The plain path on a Redis Cluster (fencing off): a shard's records as one pipeline of `XADD`s (redis-rs
//! commands, which the cluster route can send again one by one after a redirect), sent to the master of the
//! shard's slot.

use protocol::keys;
use protocol::names::StreamName;

use super::batch::ShardBatch;
use super::xadd;
use crate::config::ProducerConfig;
use crate::error::PublishError;
use crate::lanes::ClusterLanes;
use crate::published::Published;

/// Plain pipelined `XADD`s to a Redis Cluster.
pub(crate) struct ClusterPipeline {
    stream: StreamName,
    cluster: ClusterLanes,
}

impl ClusterPipeline {
    pub(crate) fn new(config: &ProducerConfig, cluster: ClusterLanes) -> Self {
        ClusterPipeline {
            stream: config.stream.clone(),
            cluster,
        }
    }

    /// The route it sends on.
    pub(crate) fn cluster(&self) -> &ClusterLanes {
        &self.cluster
    }

    /// Writes one shard's records as one pipeline; one result per record, in order.
    pub(crate) async fn write(&self, batch: &ShardBatch<'_>) -> Vec<Result<Published, PublishError>> {
        let key = keys::shard_stream(&self.stream, batch.shard);
        let count = batch.records.len();
        let mut pipe = redis::Pipeline::with_capacity(count);
        pipe.ignore_errors();
        for record in batch.records {
            pipe.add_command(batch.xadd.cmd(&key, record));
        }
        let (outcomes, replication) = self.cluster.send(batch.shard, &pipe).await;
        xadd::settle(batch.shard, outcomes, count, batch.presented.version, &replication)
    }
}
