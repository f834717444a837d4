//! The lag scrape: `XLEN` and `XINFO GROUPS` of every shard of every indexed stream, pipelined.

use protocol::names::StreamName;
use protocol::ShardId;
use redis::Value;
use std::collections::{BTreeMap, BTreeSet};
use tracing::debug;

use super::{decode_routing, group_refs, Store};
use crate::error::StoreError;

/// Shards of one stream beyond this many are left out of the scrape (cardinality guard).
pub const MAX_SHARDS_PER_STREAM: u32 = 1024;
/// Commands per pipeline of the scrape.
const PIPELINE: usize = 256;

/// One shard stream's length.
#[derive(Debug, Clone)]
pub struct ShardSample {
    /// The stream.
    pub stream: String,
    /// The shard.
    pub shard: ShardId,
    /// `XLEN`.
    pub length: u64,
}

/// One Redis consumer group on one shard stream.
#[derive(Debug, Clone)]
pub struct GroupSample {
    /// The stream.
    pub stream: String,
    /// The group.
    pub group: String,
    /// The shard.
    pub shard: ShardId,
    /// Entries not yet delivered (`XINFO GROUPS` `lag`; absent when Redis cannot tell).
    pub lag: Option<u64>,
    /// Entries delivered but not acknowledged.
    pub pending: u64,
}

/// What one scrape read.
#[derive(Debug, Default)]
pub struct LagSamples {
    /// Every shard's length.
    pub shards: Vec<ShardSample>,
    /// Every indexed group on every shard its Redis consumer group exists on.
    pub groups: Vec<GroupSample>,
}

impl Store {
    /// Reads the lag of every indexed group on every shard of its stream (up to [`MAX_SHARDS_PER_STREAM`]).
    ///
    /// # Errors
    /// Redis errors. A stream whose routing is unreadable is skipped.
    pub async fn scrape_lag(&self) -> Result<LagSamples, StoreError> {
        let mut by_stream: BTreeMap<StreamName, BTreeSet<String>> = BTreeMap::new();
        for g in group_refs(&self.indexed_groups().await?) {
            by_stream.entry(g.stream).or_default().insert(g.group.to_string());
        }
        let mut samples = LagSamples::default();
        for (stream, groups) in by_stream {
            let shard_count = match self.read_routing(&stream).await? {
                Some((_, json)) => match decode_routing(&json) {
                    Ok(r) => r.shard_count,
                    Err(e) => {
                        debug!(stream = %stream, error = %e, "routing unreadable; no lag for this stream");
                        continue;
                    }
                },
                None => continue,
            };
            let shards: Vec<ShardId> = (0..shard_count.min(MAX_SHARDS_PER_STREAM)).map(ShardId).collect();
            for chunk in shards.chunks(PIPELINE / 2) {
                // One slot per shard: one pipeline on one server, one per master on a cluster.
                let mut reads = Vec::with_capacity(chunk.len() * 2);
                for &shard in chunk {
                    let key = protocol::keys::shard_stream(&stream, shard);
                    reads.push((key.clone(), redis::cmd("XLEN").arg(&key).clone()));
                    reads.push((key.clone(), redis::cmd("XINFO").arg("GROUPS").arg(&key).clone()));
                }
                let replies: Vec<redis::RedisResult<Value>> = self.data().read_many(&reads).await?;
                for (&shard, pair) in chunk.iter().zip(replies.chunks(2)) {
                    let [length, info] = pair else { continue };
                    let length = match length {
                        Ok(Value::Int(n)) => (*n).max(0) as u64,
                        _ => 0,
                    };
                    samples.shards.push(ShardSample {
                        stream: stream.to_string(),
                        shard,
                        length,
                    });
                    // A shard stream nobody wrote to does not exist yet: XINFO answers "no such key".
                    let Ok(Value::Array(entries)) = info else { continue };
                    for entry in entries {
                        let fields = map_fields(entry);
                        let Some(name) = fields.get("name").and_then(|v| text(v)) else {
                            continue;
                        };
                        if !groups.contains(&name) {
                            continue;
                        }
                        samples.groups.push(GroupSample {
                            stream: stream.to_string(),
                            group: name,
                            shard,
                            lag: fields.get("lag").and_then(|v| int(v)),
                            pending: fields.get("pending").and_then(|v| int(v)).unwrap_or(0),
                        });
                    }
                }
            }
        }
        Ok(samples)
    }
}

/// The fields of an `XINFO` entry (a flat key/value array in RESP2, a map in RESP3).
fn map_fields(v: &Value) -> BTreeMap<String, &Value> {
    let mut out = BTreeMap::new();
    match v {
        Value::Array(items) => {
            for pair in items.chunks(2) {
                if let [k, v] = pair {
                    if let Some(k) = text(k) {
                        out.insert(k, v);
                    }
                }
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                if let Some(k) = text(k) {
                    out.insert(k, v);
                }
            }
        }
        _ => {}
    }
    out
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}
