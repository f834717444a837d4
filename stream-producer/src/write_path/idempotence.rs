//! The idempotent producer's identity (its id and this instance's random epoch) and its sequence per shard; the
//! rules the publish script applies to them are in `publish_script.rs` ("Sequence rules").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use protocol::ShardId;

use crate::config::IdempotenceConfig;

/// The idempotent producer's identity and per-shard sequences.
pub(crate) struct Idempotence {
    pub(crate) producer_id: String,
    /// Random per producer instance: a restarted producer with the same id is a new sequence, not a retry.
    pub(crate) epoch: String,
    pub(crate) idle_ms: u64,
    pub(crate) max_retries: u32,
    /// One lock per shard written so far (bounded by the shard count): held while the shard's call is in flight.
    shards: Mutex<HashMap<ShardId, Arc<tokio::sync::Mutex<ShardSequence>>>>,
}

/// The sequence of one shard.
#[derive(Debug, Default)]
pub(crate) struct ShardSequence {
    /// The sequence number of the next record.
    pub(crate) next: u64,
    /// The previous call's outcome stayed unknown: its numbers were skipped, so the shard may see a gap.
    pub(crate) gap: bool,
}

impl Idempotence {
    pub(crate) fn new(config: &IdempotenceConfig) -> Self {
        Idempotence {
            producer_id: config
                .producer_id
                .clone()
                .unwrap_or_else(|| format!("p-{}", random_hex())),
            epoch: random_hex(),
            idle_ms: u64::try_from(config.idle_expiry.as_millis()).unwrap_or(u64::MAX),
            max_retries: config.max_retries,
            shards: Mutex::default(),
        }
    }

    pub(crate) fn shard(&self, shard: ShardId) -> Arc<tokio::sync::Mutex<ShardSequence>> {
        self.shards
            .lock()
            .expect("the sequence map lock is never held across a panic")
            .entry(shard)
            .or_default()
            .clone()
    }
}

/// 128 random bits in hex, from the standard library's randomly seeded hasher (no extra dependency; uniqueness,
/// not secrecy, is what a producer id needs).
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    (0..2u64)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(i);
            h.write_u128(now);
            h.write_u32(std::process::id());
            format!("{:016x}", h.finish())
        })
        .collect()
}
