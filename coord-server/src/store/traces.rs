//! "Never created" or "lost": what Redis still holds of a group (or stream) whose metadata hash is missing.
//!
//! A missing hash alone cannot tell a typo from a lost group. Other keys can: they are written when a group is
//! created or used and are not removed with the hash. A group is *lost* when any of these remain, else *never
//! created* (the rule and its limits are in `docs/failure-handling.md`):
//! 1. its metadata hash in any form (damaged: fields but no revision);
//! 2. its member of the groups index (added at creation, never removed);
//! 3. its liveness hash (written by every join and renewal);
//! 4. a Redis consumer group of its name on one of the first [`SHARDS_CHECKED`] shard streams (created by the
//!    consumer SDK on every shard it reads; shard 0 is read as soon as the group has a member);
//! 5. checked by the caller when Redis shows nothing: the coordinator process itself found the group recently
//!    ([`Trace::SeenByThisCoordinator`]; survives a Redis that lost everything).
//!
//! The stream's routing hash is a trace of the *stream*, not of a group: a typo in a group name on a live stream
//! must be told apart from an outage, so it is only used to find the shards. A stream is lost when its routing
//! hash exists in any form, its member of the streams index remains, or its shard 0 stream exists.
//!
//! Only requests that found no hash pay for this check (a pipelined round trip or three), never a critical
//! section that found one.

use protocol::keys;
use protocol::names::{GroupName, StreamName};
use protocol::ShardId;
use redis::streams::StreamInfoGroupsReply;
use redis::{Cmd, FromRedisValue, RedisResult, Value};
use std::collections::HashSet;
use std::fmt;

use super::{decode_routing, Store};
use crate::error::StoreError;

/// How many shard streams are searched for a consumer group of the group's name: bounds the check's cost on
/// streams with thousands of shards (a group with a member reads shard 0, the first one assigned).
pub const SHARDS_CHECKED: u32 = 8;

/// What remains of something whose metadata is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absence {
    /// Nothing: it was never created (or every trace was deleted with it).
    NeverCreated,
    /// It existed: this trace remains.
    Lost(Trace),
}

/// A key that proves a group or stream existed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trace {
    /// The metadata (or routing) hash exists without a readable revision.
    DamagedHash,
    /// The groups (or streams) index names it.
    Indexed,
    /// The group's liveness hash exists.
    Liveness,
    /// A Redis consumer group of the group's name exists on this shard.
    ConsumerGroup(ShardId),
    /// The stream's shard 0 exists.
    ShardStream,
    /// This coordinator process found the group's metadata within [`crate::coordinator::SLOT_RETENTION`] (the
    /// one trace that survives a Redis that lost everything, such as a restart without persistence).
    SeenByThisCoordinator,
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trace::DamagedHash => f.write_str("its metadata hash (without a readable revision)"),
            Trace::Indexed => f.write_str("its entry in the index"),
            Trace::Liveness => f.write_str("its liveness hash"),
            Trace::ConsumerGroup(shard) => write!(f, "its Redis consumer group on shard {shard}"),
            Trace::ShardStream => f.write_str("its shard stream"),
            Trace::SeenByThisCoordinator => f.write_str("this coordinator's record of having served it recently"),
        }
    }
}

/// One keyed read: the key that routes it (on a cluster) and the command.
fn read(key: String, cmd: &mut Cmd) -> (String, Cmd) {
    (key, cmd.clone())
}

/// A reply as `T`; a command error is an error.
fn typed<T: FromRedisValue>(reply: Option<RedisResult<Value>>) -> Result<T, StoreError> {
    let value = reply.unwrap_or(Ok(Value::Nil))?;
    T::from_redis_value(value).map_err(|e| StoreError::Protocol(e.to_string()))
}

/// What remains of a group whose metadata hash has no revision.
///
/// # Errors
/// Redis errors (the caller then answers as for a lost group: failing towards the old answer is safe).
pub async fn of_group(store: &Store, stream: &StreamName, group: &GroupName) -> Result<Absence, StoreError> {
    // SMEMBERS rather than SISMEMBER: the deployment ACL grants the coordinator SMEMBERS only (a follow-up may add
    // SISMEMBER to make this O(1)); the index holds one short member per group. Four keys of four slots: one
    // pipeline on one server, one per master on a cluster (`Store::read_many`).
    let (metadata, liveness, routing) = (
        keys::group_metadata(stream, group),
        keys::group_liveness(stream, group),
        keys::stream_routing(stream),
    );
    let reads = [
        read(metadata.clone(), redis::cmd("EXISTS").arg(&metadata)),
        read(keys::groups_index(), redis::cmd("SMEMBERS").arg(keys::groups_index())),
        read(liveness.clone(), redis::cmd("EXISTS").arg(&liveness)),
        read(
            routing.clone(),
            redis::cmd("HMGET")
                .arg(&routing)
                .arg(keys::fields::REVISION)
                .arg(keys::fields::AGGREGATE),
        ),
    ];
    let mut replies = store.read_many(&reads).await?.into_iter();
    let hash: bool = typed(replies.next())?;
    let index: HashSet<String> = typed(replies.next())?;
    let liveness: bool = typed(replies.next())?;
    let (rev, routing): (Option<u64>, Option<Vec<u8>>) = typed(replies.next())?;
    if hash {
        return Ok(Absence::Lost(Trace::DamagedHash));
    }
    if index.contains(&keys::groups_index_member(stream, group)) {
        return Ok(Absence::Lost(Trace::Indexed));
    }
    if liveness {
        return Ok(Absence::Lost(Trace::Liveness));
    }
    // Without a readable routing the shards are unknown; shard 0 exists in every routing.
    let shard_count = match (rev, routing) {
        (Some(_), Some(json)) => decode_routing(&json).map_or(1, |r| r.shard_count),
        _ => 1,
    };
    let existing = existing_shards(store, stream, shard_count.min(SHARDS_CHECKED)).await?;
    if existing.is_empty() {
        return Ok(Absence::NeverCreated);
    }
    if let Some(shard) = shard_with_group(store, stream, group, existing).await? {
        return Ok(Absence::Lost(Trace::ConsumerGroup(shard)));
    }
    Ok(Absence::NeverCreated)
}

/// The shard streams that exist among the first `count`.
async fn existing_shards(store: &Store, stream: &StreamName, count: u32) -> Result<Vec<ShardId>, StoreError> {
    let shards: Vec<ShardId> = (0..count).map(ShardId).collect();
    let exists: Vec<(String, Cmd)> = shards
        .iter()
        .map(|&shard| {
            let key = keys::shard_stream(stream, shard);
            read(key.clone(), redis::cmd("EXISTS").arg(&key))
        })
        .collect();
    let present: Vec<bool> = store
        .data()
        .read_many(&exists)
        .await?
        .into_iter()
        .map(|r| typed(Some(r)))
        .collect::<Result<_, _>>()?;
    Ok(shards
        .into_iter()
        .zip(present)
        .filter_map(|(shard, present)| present.then_some(shard))
        .collect())
}

/// The first of the `existing` shard streams that has a Redis consumer group named `group`.
async fn shard_with_group(
    store: &Store,
    stream: &StreamName,
    group: &GroupName,
    existing: Vec<ShardId>,
) -> Result<Option<ShardId>, StoreError> {
    let infos: Vec<(String, Cmd)> = existing
        .iter()
        .map(|&shard| {
            let key = keys::shard_stream(stream, shard);
            read(key.clone(), redis::cmd("XINFO").arg("GROUPS").arg(&key))
        })
        .collect();
    let replies: Vec<StreamInfoGroupsReply> = store
        .data()
        .read_many(&infos)
        .await?
        .into_iter()
        .map(|r| typed(Some(r)))
        .collect::<Result<_, _>>()?;
    Ok(existing
        .into_iter()
        .zip(replies)
        .find(|(_, reply)| reply.groups.iter().any(|g| g.name == group.as_str()))
        .map(|(shard, _)| shard))
}

/// What remains of a stream whose routing hash has no readable revision.
///
/// # Errors
/// Redis errors.
pub async fn of_stream(store: &Store, stream: &StreamName) -> Result<Absence, StoreError> {
    let (routing, shard0) = (keys::stream_routing(stream), keys::shard_stream(stream, ShardId(0)));
    let reads = [
        read(routing.clone(), redis::cmd("EXISTS").arg(&routing)),
        read(keys::streams_index(), redis::cmd("SMEMBERS").arg(keys::streams_index())),
    ];
    let mut replies = store.read_many(&reads).await?.into_iter();
    let hash: bool = typed(replies.next())?;
    let index: HashSet<String> = typed(replies.next())?;
    // Shard 0 is on the data Redis, which may not be the metadata's (`Store::data`).
    let shard_read = [read(shard0.clone(), redis::cmd("EXISTS").arg(&shard0))];
    let shard: bool = typed(store.data().read_many(&shard_read).await?.into_iter().next())?;
    let indexed = index.contains(stream.as_str());
    Ok(if hash {
        Absence::Lost(Trace::DamagedHash)
    } else if indexed {
        Absence::Lost(Trace::Indexed)
    } else if shard {
        Absence::Lost(Trace::ShardStream)
    } else {
        Absence::NeverCreated
    })
}
