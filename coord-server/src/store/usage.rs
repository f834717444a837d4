//! The usage scrape: how long every stream's shards are (`XLEN`) and how much memory they take (`MEMORY USAGE`),
//! and what each Redis reports of its memory (`INFO memory`), for the per-tenant metrics and `/status`.
//!
//! Cost, bounded: at most [`MAX_USAGE_SHARDS`] shard keys per scrape (streams in name order, each up to
//! [`super::lag::MAX_SHARDS_PER_STREAM`] shards), two commands per key pipelined on the data Redis
//! (`XLEN`, O(1); `MEMORY USAGE key SAMPLES` [`MEMORY_SAMPLES`], which walks that many radix-tree nodes, not the
//! whole stream), plus one `INFO memory` per master. The caller throttles it (`metrics::tenants`).
//!
//! Also what a token uses of its member quota: the members of a group with a lease.

use protocol::keys;
use protocol::names::{GroupName, StreamName};
use protocol::ShardId;
use redis::Value;
use std::collections::BTreeSet;

use super::{decode_routing, group_refs, Store};
use crate::error::StoreError;

/// Shard keys read by one scrape at most; the streams past it are left out and the scrape says so.
pub const MAX_USAGE_SHARDS: usize = 4096;
/// `MEMORY USAGE ... SAMPLES n`: the radix-tree nodes Redis looks at to estimate a stream's size.
pub const MEMORY_SAMPLES: u32 = 5;
/// Commands per pipeline.
const PIPELINE: usize = 256;

/// One stream's shards, summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamUsage {
    /// The stream.
    pub stream: String,
    /// Shards read.
    pub shards: u32,
    /// Entries over those shards (`XLEN`).
    pub length: u64,
    /// Bytes over those shards (`MEMORY USAGE`, an estimate from samples).
    pub memory_bytes: u64,
}

/// What one Redis reports of its memory (`INFO memory`), summed over the masters of a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    /// `used_memory`.
    pub used_bytes: u64,
    /// `maxmemory` (0: no limit; on a cluster 0 when any master has none).
    pub max_bytes: u64,
}

/// What one scrape read.
#[derive(Debug, Clone, Default)]
pub struct UsageSamples {
    /// Per stream, in name order.
    pub streams: Vec<StreamUsage>,
    /// Whether [`MAX_USAGE_SHARDS`] left streams or shards out.
    pub truncated: bool,
}

impl Store {
    /// Reads the length and memory of the shards of every indexed stream (see the module docs for the bounds).
    ///
    /// # Errors
    /// Redis errors. A stream whose routing is unreadable is skipped; a shard whose read fails counts 0.
    pub async fn scrape_usage(&self) -> Result<UsageSamples, StoreError> {
        let mut streams: BTreeSet<StreamName> = group_refs(&self.indexed_groups().await?)
            .into_iter()
            .map(|g| g.stream)
            .collect();
        streams.extend(self.indexed_streams().await?);
        let mut out = UsageSamples::default();
        let mut budget = MAX_USAGE_SHARDS;
        for stream in streams {
            let Some((_, json)) = self.read_routing(&stream).await? else {
                continue;
            };
            let Ok(routing) = decode_routing(&json) else { continue };
            let wanted = routing.shard_count.min(super::lag::MAX_SHARDS_PER_STREAM) as usize;
            if wanted > budget || routing.shard_count > super::lag::MAX_SHARDS_PER_STREAM {
                out.truncated = true;
            }
            let take = wanted.min(budget);
            if take == 0 {
                continue;
            }
            budget -= take;
            out.streams.push(self.stream_usage(&stream, take as u32).await?);
        }
        Ok(out)
    }

    /// Length and memory of shards `0..shards` of `stream`, pipelined on the data Redis.
    async fn stream_usage(&self, stream: &StreamName, shards: u32) -> Result<StreamUsage, StoreError> {
        let mut usage = StreamUsage {
            stream: stream.to_string(),
            shards,
            length: 0,
            memory_bytes: 0,
        };
        let ids: Vec<ShardId> = (0..shards).map(ShardId).collect();
        for chunk in ids.chunks(PIPELINE / 2) {
            let mut reads = Vec::with_capacity(chunk.len() * 2);
            for &shard in chunk {
                let key = protocol::keys::shard_stream(stream, shard);
                reads.push((key.clone(), redis::cmd("XLEN").arg(&key).clone()));
                let mut usage_cmd = redis::cmd("MEMORY");
                usage_cmd.arg("USAGE").arg(&key).arg("SAMPLES").arg(MEMORY_SAMPLES);
                reads.push((key, usage_cmd));
            }
            for reply in self.data().read_many(&reads).await?.chunks(2) {
                if let [length, memory] = reply {
                    usage.length += count(length);
                    // A shard nobody wrote to does not exist: MEMORY USAGE answers nil.
                    usage.memory_bytes += count(memory);
                }
            }
        }
        Ok(usage)
    }

    /// The streams index (streams with a group, see `index`).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn indexed_streams(&self) -> Result<Vec<StreamName>, StoreError> {
        let mut conn = self.conn.clone();
        let names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(protocol::keys::streams_index())
            .query_async(&mut conn)
            .await?;
        Ok(names.iter().filter_map(|n| StreamName::new(n).ok()).collect())
    }

    /// `used_memory` and `maxmemory` of this store's Redis (summed over the masters of a cluster).
    ///
    /// # Errors
    /// Redis errors, naming the cluster node.
    pub async fn memory_info(&self) -> Result<MemoryInfo, StoreError> {
        let mut total = MemoryInfo::default();
        let mut unlimited = false;
        for (_, info) in self.info("memory").await? {
            let m = parse_memory(&info);
            total.used_bytes += m.used_bytes;
            total.max_bytes += m.max_bytes;
            unlimited |= m.max_bytes == 0;
        }
        if unlimited {
            total.max_bytes = 0;
        }
        Ok(total)
    }
}

/// `used_memory` and `maxmemory` of one `INFO memory` text (0 when absent).
pub fn parse_memory(info: &str) -> MemoryInfo {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    MemoryInfo {
        used_bytes: field("used_memory"),
        max_bytes: field("maxmemory"),
    }
}

/// A non-negative integer reply; anything else (nil, an error) counts 0.
fn count(reply: &redis::RedisResult<Value>) -> u64 {
    match reply {
        Ok(Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}

impl Store {
    /// The members of a group with a lease (`HLEN` of its liveness hash): one command, no aggregate read.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn leased_members(&self, stream: &StreamName, group: &GroupName) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("HLEN")
            .arg(keys::group_liveness(stream, group))
            .query_async(&mut conn)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_fields_are_read_by_their_exact_name() {
        let info = "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\nused_memory_rss:9\r\n\
                    maxmemory:52428800\r\nmaxmemory_human:50.00M\r\nmaxmemory_policy:noeviction\r\n";
        assert_eq!(
            parse_memory(info),
            MemoryInfo {
                used_bytes: 1_048_576,
                max_bytes: 52_428_800
            }
        );
        assert_eq!(parse_memory("# Memory\r\n"), MemoryInfo::default());
    }

    #[test]
    fn only_integer_replies_count() {
        assert_eq!(count(&Ok(Value::Int(7))), 7);
        assert_eq!(count(&Ok(Value::Int(-1))), 0);
        assert_eq!(count(&Ok(Value::Nil)), 0);
    }
}
