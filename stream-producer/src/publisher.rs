//! Publishing: routes records to shards and hands each shard's records to the producer's write path
//! ([`WritePath`], chosen when the producer was built; the publisher does not know which it drives).
//!
//! # Routing of records
//! * A record with a key goes to [`protocol::routing::shard_for_key`]`(key, shard_count)` (xxHash64 + jump
//!   consistent hash), so all records of one key land on one shard, in order, while the shard count holds.
//! * A record without a key goes round-robin over the shards (a per-producer counter), which spreads load
//!   evenly and promises no order between such records.
//!
//! The records of one publish call are grouped by shard, and the shards' batches are written concurrently, one
//! write (a pipeline, a transaction or script calls) per shard; the lanes keep each shard's writes in issue order
//! ([`crate::lanes`]).
//!
//! # Outcomes
//! A failure to *open* a connection means nothing was sent ([`PublishError::Connect`], not written); a failure
//! after the request was handed to an open connection (reset, EOF, timeout) means Redis may have executed any
//! prefix of it ([`PublishError::ConnectionLost`], unknown). An error reply to one `XADD` fails that record only
//! ([`PublishError::Rejected`], not written). A fenced batch fails with [`PublishError::Fenced`] (not written). A
//! durable producer ends every write request with `WAIT`; records it does not confirm are
//! [`PublishError::NotReplicated`], unknown. Each record's final outcome is counted once ([`Publisher::count`]),
//! by the caller after any re-route: a record a fence refused and that was then written counts as written only.
//!
//! # Redis check
//! The first connection to a server (or cluster node) is checked before it is used
//! ([`client_core::check_redis`]): the Redis version and every command the producer sends
//! ([`REDIS_REQUIREMENTS`](crate::lanes::REDIS_REQUIREMENTS)). A server that cannot serve the producer (too old,
//! a command missing or renamed) fails every publish with [`PublishError::RedisUnsupported`] naming the command
//! and the URL (without password), for the life of the producer; a check cut short by a transport error is a
//! connection failure and is taken again on the next connection.

use std::borrow::Borrow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use protocol::routing::shard_for_key;
use protocol::ShardId;

use crate::error::{PublishError, WriteState};
use crate::fence::Presented;
use crate::lanes::ConnectFailure;
use crate::published::Published;
use crate::record::Record;
use crate::routing_cache::RoutingInfo;
use crate::stats::Stats;
use crate::write_path::{ShardBatch, WritePath};

/// Routes records to shards and writes them through the producer's write path.
#[derive(Debug)]
pub(crate) struct Publisher {
    path: WritePath,
    /// Round-robin position for records without a key.
    round_robin: AtomicU64,
    /// Where every record's outcome is counted.
    stats: Arc<Stats>,
}

impl Publisher {
    pub(crate) fn new(path: WritePath, stats: Arc<Stats>) -> Self {
        Publisher {
            path,
            round_robin: AtomicU64::new(0),
            stats,
        }
    }

    /// The idempotent producer's id, when idempotent.
    pub(crate) fn producer_id(&self) -> Option<&str> {
        self.path.producer_id()
    }

    /// Opens every connection of the write path now.
    ///
    /// # Errors
    /// The first connection error.
    pub(crate) async fn connect_all(&self) -> Result<(), ConnectFailure> {
        self.path.connect_all().await
    }

    /// Chooses the shard of every record: by key, or round-robin for keyless records.
    fn shards_of<R: Borrow<Record>>(&self, records: &[R], shard_count: u32) -> Vec<ShardId> {
        let count = shard_count.max(1);
        let keyless = records.iter().filter(|r| (*r).borrow().key().is_none()).count() as u64;
        let mut next = if keyless > 0 {
            self.round_robin.fetch_add(keyless, Ordering::Relaxed)
        } else {
            0
        };
        records
            .iter()
            .map(|r| match r.borrow().key() {
                Some(key) => shard_for_key(key, count),
                None => {
                    let shard = ShardId((next % u64::from(count)) as u32);
                    next = next.wrapping_add(1);
                    shard
                }
            })
            .collect()
    }

    /// Publishes `records` with `routing`, one write per shard, the shards' writes concurrently. Returns one
    /// result per record, in input order. Records must have been checked ([`Record::check`]).
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense of outcomes: dropping the future after writes left leaves their records in
    /// an unknown state (they may be written).
    pub(crate) async fn publish<R: Borrow<Record>>(
        &self,
        records: &[R],
        routing: RoutingInfo,
    ) -> Vec<Result<Published, PublishError>> {
        let shards = self.shards_of(records, routing.shard_count);
        // The records of each shard, in input order: one stable sort instead of a map of vectors. The groups come
        // out in shard order, which is also the deterministic issue order (per lane the pipelines are written in
        // this order).
        let mut order: Vec<usize> = (0..records.len()).collect();
        order.sort_by_key(|&i| shards[i]);
        let groups: Vec<(ShardId, &[usize])> = order
            .chunk_by(|&a, &b| shards[a] == shards[b])
            .map(|indices| (shards[indices[0]], indices))
            .collect();
        let xadd = self.path.xadd_now();
        let xadd = &xadd;
        let presented = Presented {
            version: routing.version,
            records: routing.shard_records,
            count: routing.shard_count,
        };
        let writes = groups.iter().map(|&(shard, indices)| async move {
            let shard_records: Vec<&Record> = indices.iter().map(|&i| records[i].borrow()).collect();
            let batch = ShardBatch {
                shard,
                records: &shard_records,
                presented,
                xadd,
            };
            self.path.write(&batch).await
        });
        let results = futures::future::join_all(writes).await;
        let mut out: Vec<Option<Result<Published, PublishError>>> = vec![None; records.len()];
        for ((_, indices), shard_results) in groups.into_iter().zip(results) {
            for (&i, r) in indices.iter().zip(shard_results) {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.expect("every record belongs to exactly one shard group"))
            .collect()
    }

    /// Counts the final outcomes of records (in the stats and the metrics).
    pub(crate) fn count(&self, results: &[Result<Published, PublishError>]) {
        let (mut written, mut not_written, mut unknown) = (0u64, 0u64, 0u64);
        let mut not_replicated = 0u64;
        for r in results {
            match r {
                Ok(_) => written += 1,
                Err(e) if e.write_state() == WriteState::Unknown => {
                    unknown += 1;
                    not_replicated += u64::from(e.is_not_replicated());
                }
                Err(_) => not_written += 1,
            }
        }
        let s = &self.stats;
        s.records_not_replicated.fetch_add(not_replicated, Ordering::Relaxed);
        s.records_written.fetch_add(written, Ordering::Relaxed);
        s.records_not_written.fetch_add(not_written, Ordering::Relaxed);
        s.records_unknown.fetch_add(unknown, Ordering::Relaxed);
        s.metrics.records(written, not_written, unknown);
    }
}

#[cfg(test)]
mod tests {
    use protocol::names::StreamName;

    use super::*;
    use crate::config::ProducerConfig;

    fn publisher() -> Publisher {
        let mut config = ProducerConfig::new(StreamName::new("orders").unwrap());
        config.redis_url = "redis://127.0.0.1:1".into();
        let stats = Arc::<Stats>::default();
        Publisher::new(WritePath::new(&config, stats.clone()).unwrap(), stats)
    }

    #[test]
    fn keyed_records_follow_shard_for_key() {
        let p = publisher();
        let records: Vec<Record> = (0..100)
            .map(|i| Record::with_key(format!("k{i}")).field("f", "v"))
            .collect();
        let shards = p.shards_of(&records, 7);
        for (r, s) in records.iter().zip(shards) {
            assert_eq!(s, shard_for_key(r.key().unwrap(), 7));
        }
    }

    #[test]
    fn keyless_records_go_round_robin_across_calls() {
        let p = publisher();
        let records: Vec<Record> = (0..5).map(|_| Record::without_key().field("f", "v")).collect();
        let first = p.shards_of(&records, 4);
        let second = p.shards_of(&records, 4);
        let all: Vec<u32> = first.iter().chain(&second).map(|s| s.0).collect();
        assert_eq!(all, vec![0, 1, 2, 3, 0, 1, 2, 3, 0, 1]);
    }
}
