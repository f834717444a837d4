//! The Redis key layout: the one place that builds every key the coordinator and the SDKs touch.
//!
//! Keys that one Lua script touches together share a hash tag, so every script runs in one Redis Cluster slot:
//!
//! | key | tag | what it holds |
//! |---|---|---|
//! | `redis-stream:coord:{<stream>:<group>}:metadata` | group | the group's metadata in fields (hash: `group`, `m:<member>`, `s:<block>`, `log:<revision>`, and `revision`, `livenessRevision`, `schemaVersion`, `layoutVersion`, `updatedAt`, `runId`; see [`docs/protocol.md`] §6.2.1) |
//! | `redis-stream:coord:{<stream>:<group>}:liveness` | group | member leases renewed by no-change heartbeats (hash: member id -> lease end, Redis time in ms) |
//! | `redis-stream:coord:{<stream>:<group>}:mutex` | group | the group's critical-section mutex (`SET NX PX`) |
//! | `redis-stream:coord:{<stream>}:routing` | stream | shard count and routing version of a stream (hash, same fields as metadata) |
//! | `redis-stream:coord:{<stream>}:routing-mutex` | stream | the stream's routing mutex |
//! | `redis-stream:coord:groups` / `redis-stream:coord:streams` | none | rebuildable indexes (sets) |
//! | `redis-stream:coord:quota:<token name>:mutex` | none | a token's group-create mutex (`SET NX PX`): held while a coordinator counts the token's groups and creates one |
//! | `redis-stream:coord:due` | none | the due index (sorted set: group index member -> Redis time in ms of its next deadline) |
//! | `redis-stream:shard:{<stream>:<n>:<salt>}` | shard | the Redis stream of shard `n` |
//! | `redis-stream:dead-letter:{<stream>:<n>:<salt>}` | shard | entries of shard `n` that exceeded the delivery limit |
//! | `redis-stream:shard-fence:{<stream>:<n>:<salt>}` | shard | the data-plane fence of shard `n` (hash: `routingVersion`, the lowest routing version a producer must hold to write into the shard; written only by the coordinator's seal) |
//! | `redis-stream:producer-seq:{<stream>:<n>:<salt>}:<producer id>` | shard | an idempotent producer's sequence state for shard `n` (hash: `epoch`, `next`, `first`, `ids`; written only by the producer's publish script, expires when the producer is idle) |
//!
//! Every shard gets its own tag so the shards of one stream spread over a Cluster; a shard's dead-letter stream,
//! fence and sequence state share it so one script or `MULTI` touches them together.
//!
//! # Shard slots
//! A shard's tag does not leave its slot to the hash: `<salt>` (three letters or digits,
//! [`crate::slot::salt_for`]) puts shard `n` of `stream` into slot
//! `(key_slot(stream) + reverse14(n)) mod 16384` ([`shard_slot`]). `reverse14` (the 14 low bits of `n` reversed)
//! places shard 0 and 1 half the slot space apart, 2 and 3 in the middle of the halves, and so on, so the first
//! `N` shards split every contiguous slot range, such as one master's share, in proportion to its size: within
//! one shard of the even share for a power of two. Hashed tags spread binomially instead (8 shards over 3
//! masters measured 4 / 2 / 2). A shard's slot depends on the stream and `n` only, never on the shard count, so
//! growing a stream renames no key; `key_slot(stream)` keeps shard 0 of different streams on different
//! masters.
//!
//! [`docs/protocol.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/protocol.md

use crate::names::{GroupName, StreamName};
use crate::version::ShardId;

/// Common prefix of every key this project writes.
pub const KEY_PREFIX: &str = "redis-stream";

/// Version of this key layout, stored in every metadata hash as `layoutVersion`.
/// Version 2: shard tags carry the slot-choosing salt (version 1 hashed `{<stream>:<n>}`).
pub const LAYOUT_VERSION: u32 = 2;

/// Hash fields of a metadata or routing hash.
pub mod fields {
    /// The aggregate JSON document.
    pub const AGGREGATE: &str = "aggregate";
    /// The store revision (compare-and-set counter).
    pub const REVISION: &str = "revision";
    /// Schema version of the aggregate JSON.
    pub const SCHEMA_VERSION: &str = "schemaVersion";
    /// Version of the key layout.
    pub const LAYOUT_VERSION: &str = "layoutVersion";
    /// Redis time (ms) of the last successful write.
    pub const UPDATED_AT: &str = "updatedAt";
    /// Counter bumped by every liveness renewal (checked by aggregate writes, never by renewals).
    pub const LIVENESS_REVISION: &str = "livenessRevision";
    /// Redis run id at the last aggregate write (a different one now means a restart or failover).
    pub const RUN_ID: &str = "runId";
}

/// Group metadata hash.
pub fn group_metadata(stream: &StreamName, group: &GroupName) -> String {
    format!("{KEY_PREFIX}:coord:{{{stream}:{group}}}:metadata")
}

/// Group liveness hash (member leases renewed without rewriting the aggregate).
pub fn group_liveness(stream: &StreamName, group: &GroupName) -> String {
    format!("{KEY_PREFIX}:coord:{{{stream}:{group}}}:liveness")
}

/// Group critical-section mutex.
pub fn group_mutex(stream: &StreamName, group: &GroupName) -> String {
    format!("{KEY_PREFIX}:coord:{{{stream}:{group}}}:mutex")
}

/// Stream routing hash (shard count, routing version).
pub fn stream_routing(stream: &StreamName) -> String {
    format!("{KEY_PREFIX}:coord:{{{stream}}}:routing")
}

/// Stream routing mutex.
pub fn stream_routing_mutex(stream: &StreamName) -> String {
    format!("{KEY_PREFIX}:coord:{{{stream}}}:routing-mutex")
}

/// Rebuildable index of groups: a set of `<stream>:<group>` members.
pub fn groups_index() -> String {
    format!("{KEY_PREFIX}:coord:groups")
}

/// The due index: a sorted set of [`groups_index_member`]s scored by the Redis time (ms) each group next needs a
/// tick (`+inf`: none). Untagged like the groups index; rebuilt by the coordinator's sweep when lost.
pub fn due_index() -> String {
    format!("{KEY_PREFIX}:coord:due")
}

/// Rebuildable index of streams: a set of stream names.
pub fn streams_index() -> String {
    format!("{KEY_PREFIX}:coord:streams")
}

/// The mutex a coordinator holds while it counts a token's groups and creates one (`SET NX PX`, see the
/// coordinator's `coordinator/quota/lock.rs`), keyed by the token's name. One key, so any slot of a Cluster serves it.
pub fn quota_mutex(token_name: &str) -> String {
    format!("{KEY_PREFIX}:coord:quota:{token_name}:mutex")
}

/// `SCAN` pattern matching every group metadata hash (used to rebuild the groups index).
pub fn group_metadata_pattern() -> String {
    format!("{KEY_PREFIX}:coord:{{*}}:metadata")
}

/// The member of [`groups_index`] for one group.
pub fn groups_index_member(stream: &StreamName, group: &GroupName) -> String {
    format!("{stream}:{group}")
}

/// The slot every key of shard `shard` of `stream` is in (see [Shard slots](self#shard-slots)).
pub fn shard_slot(stream: &StreamName, shard: ShardId) -> u16 {
    let base = crate::slot::key_slot(stream.as_str().as_bytes());
    (base + crate::slot::reverse14(shard.0)) % crate::slot::SLOTS
}

/// The hash tag of shard `shard` of `stream`: `<stream>:<n>:<salt>`, in [`shard_slot`].
pub fn shard_tag(stream: &StreamName, shard: ShardId) -> String {
    let prefix = format!("{stream}:{shard}:");
    let salt = crate::slot::salt_for(prefix.as_bytes(), shard_slot(stream, shard));
    let mut tag = prefix;
    tag.extend(salt.iter().map(|&b| char::from(b)));
    tag
}

/// The Redis stream key of one shard.
pub fn shard_stream(stream: &StreamName, shard: ShardId) -> String {
    format!("{KEY_PREFIX}:shard:{{{}}}", shard_tag(stream, shard))
}

/// The dead-letter stream of one shard (same hash slot as the shard).
pub fn dead_letter_stream(stream: &StreamName, shard: ShardId) -> String {
    format!("{KEY_PREFIX}:dead-letter:{{{}}}", shard_tag(stream, shard))
}

/// The data-plane fence of one shard (same hash slot as the shard, so the publish script can check it atomically
/// with the write). A hash with field [`shard_fence_fields::ROUTING_VERSION`]; an absent key or field means no
/// fence (version 0).
pub fn shard_fence(stream: &StreamName, shard: ShardId) -> String {
    format!("{KEY_PREFIX}:shard-fence:{{{}}}", shard_tag(stream, shard))
}

/// Hash fields of a [`shard_fence`] key: the shard's own record, in its own hash slot. Written only by the
/// coordinator (see [`docs/resharding.md`], "Shard records").
///
/// [`docs/resharding.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/resharding.md
pub mod shard_fence_fields {
    /// The lowest routing version a producer must present to write into the shard (decimal).
    pub const ROUTING_VERSION: &str = "routingVersion";
    /// The routing version whose layout created the shard (decimal; `1` for the shards a stream was created
    /// with). Present: the shard exists. Written before any producer can learn of the shard; a fenced producer
    /// writes only into a shard whose record is present and no newer than its routing.
    pub const BORN_VERSION: &str = "bornVersion";
    /// The shard count before the growth that created the shard (decimal; `0` for the first shards): with
    /// [`BORN_VERSION`], what a lost growth was, recoverable from the shards themselves.
    pub const BORN_PARENTS: &str = "bornParents";
    /// The shard count of the routing at [`ROUTING_VERSION`] (decimal), written with the fence whenever it is
    /// raised. A producer that presents that version or a later one with fewer shards routes by a layout from
    /// another history of the routing (a version issued again after a restore, or a lost history's higher number)
    /// and is refused: with jump consistent hashing a layout is its shard count, so counts tell layouts apart
    /// where version numbers cannot. Absent (records written before it existed): not checked.
    pub const FENCE_COUNT: &str = "fenceCount";
    /// The shard count of the routing at [`BORN_VERSION`] (decimal), written with the birth: a producer at or
    /// above the birth with fewer shards is refused, as for [`FENCE_COUNT`]. Absent: not checked.
    pub const BORN_COUNT: &str = "bornCount";
    /// Prefix of the fields `seal:<routing version>`: where the growth of that version sealed this shard (an
    /// entry id), recorded with the fence in one script.
    pub const SEAL_PREFIX: &str = "seal:";

    /// The field of the seal of growth `version`.
    pub fn seal(version: crate::RoutingVersion) -> String {
        format!("{SEAL_PREFIX}{version}")
    }
}

/// An idempotent producer's sequence state for one shard (same hash slot as the shard, so the publish script checks
/// and advances it atomically with the write). `producer_id` is chosen by the producer SDK (it checks its
/// characters and length); the key expires when the producer stops writing to the shard.
pub fn producer_sequence(stream: &StreamName, shard: ShardId, producer_id: &str) -> String {
    format!(
        "{KEY_PREFIX}:producer-seq:{{{}}}:{producer_id}",
        shard_tag(stream, shard)
    )
}

/// The hash tag of a key (the part Redis Cluster hashes), as Redis computes it: the text between the first `{`
/// and the next `}`, if non-empty; else the whole key.
pub fn hash_tag(key: &str) -> &str {
    &key[crate::slot::tag_range(key.as_bytes())]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> (StreamName, GroupName) {
        (StreamName::new("orders").unwrap(), GroupName::new("billing").unwrap())
    }

    #[test]
    fn group_keys_share_one_slot() {
        let (s, g) = names();
        assert_eq!(group_metadata(&s, &g), "redis-stream:coord:{orders:billing}:metadata");
        let tag = hash_tag(&group_metadata(&s, &g)).to_owned();
        assert_eq!(tag, "orders:billing");
        assert_eq!(hash_tag(&group_liveness(&s, &g)), tag);
        assert_eq!(hash_tag(&group_mutex(&s, &g)), tag);
    }

    #[test]
    fn routing_keys_share_one_slot() {
        let (s, _) = names();
        assert_eq!(stream_routing(&s), "redis-stream:coord:{orders}:routing");
        assert_eq!(hash_tag(&stream_routing(&s)), hash_tag(&stream_routing_mutex(&s)));
    }

    #[test]
    fn every_shard_has_its_own_tag_shared_with_its_dead_letter_stream() {
        let (s, _) = names();
        let k3 = shard_stream(&s, ShardId(3));
        let tag = shard_tag(&s, ShardId(3));
        assert!(
            tag.starts_with("orders:3:") && tag.len() == "orders:3:".len() + 3,
            "{tag}"
        );
        assert_eq!(k3, format!("redis-stream:shard:{{{tag}}}"));
        assert_eq!(
            crate::slot::key_slot(k3.as_bytes()),
            shard_slot(&s, ShardId(3)),
            "the salt puts the shard into its slot"
        );
        assert_ne!(hash_tag(&k3), hash_tag(&shard_stream(&s, ShardId(4))));
        assert_eq!(hash_tag(&k3), hash_tag(&dead_letter_stream(&s, ShardId(3))));
        assert_eq!(
            shard_fence(&s, ShardId(3)),
            format!("redis-stream:shard-fence:{{{tag}}}")
        );
        assert_eq!(hash_tag(&k3), hash_tag(&shard_fence(&s, ShardId(3))));
        let seq = producer_sequence(&s, ShardId(3), "p-1");
        assert_eq!(seq, format!("redis-stream:producer-seq:{{{tag}}}:p-1"));
        assert_eq!(hash_tag(&k3), hash_tag(&seq));
        // The producer id cannot move the key to another slot: only the first {...} is the tag.
        assert_eq!(hash_tag(&producer_sequence(&s, ShardId(3), "{x}")), hash_tag(&k3));
    }

    #[test]
    fn shards_sit_half_the_slot_space_apart_then_a_quarter() {
        let (s, _) = names();
        let base = crate::slot::key_slot(b"orders");
        let slot = |n| shard_slot(&s, ShardId(n));
        assert_eq!(slot(0), base);
        assert_eq!(slot(1), (base + 8192) % 16384);
        assert_eq!(slot(2), (base + 4096) % 16384);
        assert_eq!(slot(3), (base + 12288) % 16384);
        // Every slot of a 1024-shard stream is distinct, and the same whatever the shard count.
        let slots: std::collections::BTreeSet<u16> = (0..1024).map(slot).collect();
        assert_eq!(slots.len(), 1024);
    }

    #[test]
    fn hash_tag_follows_redis_rules() {
        assert_eq!(hash_tag("a{b}c"), "b");
        assert_eq!(hash_tag("a{}c"), "a{}c");
        assert_eq!(hash_tag("abc"), "abc");
        assert_eq!(hash_tag("a{b"), "a{b");
    }
}
