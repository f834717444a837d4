//! The plain path (fencing off, one server): a shard's records as one pipeline of `XADD`s, written as RESP into
//! one buffer and sent on the shard's lane. Nothing is checked: a reshard cannot fence these writes.

use protocol::keys;
use protocol::names::StreamName;

use super::batch::ShardBatch;
use super::xadd;
use crate::config::ProducerConfig;
use crate::error::PublishError;
use crate::lanes::ServerLanes;
use crate::published::Published;

/// Plain pipelined `XADD`s to one server.
pub(crate) struct Plain {
    stream: StreamName,
    lanes: ServerLanes,
}

impl Plain {
    pub(crate) fn new(config: &ProducerConfig, lanes: ServerLanes) -> Self {
        Plain {
            stream: config.stream.clone(),
            lanes,
        }
    }

    /// The lanes it sends on.
    pub(crate) fn lanes(&self) -> &ServerLanes {
        &self.lanes
    }

    /// Writes one shard's records as one pipeline; one result per record, in order.
    pub(crate) async fn write(&self, batch: &ShardBatch<'_>) -> Vec<Result<Published, PublishError>> {
        let key = keys::shard_stream(&self.stream, batch.shard);
        let count = batch.records.len();
        let commands = batch.xadd.encode(&key, batch.records.iter().copied());
        let (outcomes, replication) = self.lanes.send_packed(batch.shard, commands, count).await;
        xadd::settle(batch.shard, outcomes, count, batch.presented.version, &replication)
    }
}
