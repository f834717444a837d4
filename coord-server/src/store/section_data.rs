//! What a critical section names, reads and writes: its keys, the aggregate the caller has cached, what `LOAD`
//! read and what `COMMIT` writes, and the mutex token it holds.

use protocol::keys;
use protocol::metadata::ROUTING_SCHEMA_VERSION;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::StoreRevision;
use std::collections::HashSet;
use std::sync::{Arc, Mutex as StdMutex};

use super::group_fields::{GroupRead, FIELDS_SCHEMA};

/// The keys of one critical section: a hash, its liveness hash and its mutex (one hash tag), and the schema
/// version of the hash's document.
#[derive(Debug, Clone)]
pub struct SectionKeys {
    /// The metadata (or routing) hash.
    pub hash: String,
    /// The liveness hash (for routing: unused, the routing hash itself).
    pub liveness: String,
    /// The mutex.
    pub mutex: String,
    /// The `schemaVersion` this build reads and writes in `hash`.
    pub schema: u32,
    /// Whether `hash` is a group's, kept in fields ([`super::group_fields`]); a routing hash keeps one document.
    pub fields: bool,
}

impl SectionKeys {
    /// Keys of a group.
    pub fn group(stream: &StreamName, group: &GroupName) -> Self {
        SectionKeys {
            hash: keys::group_metadata(stream, group),
            liveness: keys::group_liveness(stream, group),
            mutex: keys::group_mutex(stream, group),
            schema: FIELDS_SCHEMA,
            fields: true,
        }
    }

    /// Keys of a stream's routing.
    pub fn routing(stream: &StreamName) -> Self {
        let hash = keys::stream_routing(stream);
        SectionKeys {
            liveness: hash.clone(),
            hash,
            mutex: keys::stream_routing_mutex(stream),
            schema: ROUTING_SCHEMA_VERSION,
            fields: false,
        }
    }
}

/// Which liveness entries to load.
#[derive(Debug, Clone, Copy)]
pub enum LivenessScope<'a> {
    /// None.
    None,
    /// One member's.
    Member(&'a MemberId),
    /// These members' (a batch of heartbeats).
    Members(&'a [&'a MemberId]),
    /// All of them (ticks).
    All,
}

/// The aggregate a caller has parsed already: `LOAD` skips sending it while the stored revision is the same and
/// the stored aggregate has the same length (every load) and the same digest (loads of all liveness, i.e. ticks
/// and fences, which hash it). For a group in fields: the revision, and as digest the XOR of the fields'
/// digests ([`super::group_fields::StoredFields::xor`]), which loads of all liveness compare.
#[derive(Debug, Clone, Copy)]
pub struct Cached<'a> {
    /// The revision it was read or written at.
    pub revision: StoreRevision,
    /// [`digest`](super::digest) of its JSON.
    pub digest: &'a str,
    /// Length of its JSON in bytes.
    pub len: usize,
    /// For a group in fields: what a load that is not a tick compares ([`super::group_fields::StoredFields::shape`]).
    pub shape: Option<&'a str>,
}

/// What `LOAD` read while taking the mutex.
#[derive(Debug)]
pub struct Loaded {
    /// Redis `TIME` in ms.
    pub now_ms: u64,
    /// The hash's revision; `None` when the hash does not exist.
    pub revision: Option<StoreRevision>,
    /// The liveness revision.
    pub liveness_revision: u64,
    /// `schemaVersion` field.
    pub schema_version: Option<u32>,
    /// `layoutVersion` field.
    pub layout_version: Option<u32>,
    /// The aggregate JSON, unless the caller's cached one is still current (or the hash is missing). Routing
    /// hashes only: a group's data is in [`Loaded::group`].
    pub aggregate: Option<Vec<u8>>,
    /// What the load sent of a group hash's fields (`None` for routing hashes and missing groups).
    pub group: Option<GroupRead>,
    /// [`digest`](super::digest) of the aggregate this load stands for (the one sent, or the cached one on a hit); empty when
    /// there is none.
    pub aggregate_digest: String,
    /// Whether the caller's [`Cached`] aggregate is the stored one (same revision, same bytes).
    pub cache_hit: bool,
    /// Liveness entries read: member -> lease end ms.
    pub liveness: Vec<(MemberId, u64)>,
    /// Redis run id the aggregate was last written under (empty when unknown).
    pub stored_run_id: String,
    /// The server's run id now.
    pub run_id: String,
    /// Whether the liveness hash is absent (a group with members always has one: it was deleted or evicted).
    pub liveness_missing: bool,
}

impl Loaded {
    /// Whether the stored metadata was written by another Redis server incarnation (restart or failover).
    pub fn run_id_changed(&self) -> bool {
        !self.stored_run_id.is_empty() && !self.run_id.is_empty() && self.stored_run_id != self.run_id
    }
}

/// What to write in `COMMIT`.
#[derive(Debug, Default)]
pub struct Write<'a> {
    /// New aggregate JSON (bumps `revision`), written with the section's [`SectionKeys::schema`].
    pub aggregate: Option<&'a str>,
    /// [`Loaded::aggregate_digest`] of the load the decision read: an aggregate is only written over that one.
    pub replaces: &'a str,
    /// Liveness renewals (member, lease end ms); a lease never moves backwards.
    pub renew: &'a [(MemberId, u64)],
    /// Liveness entries to delete.
    pub forget: &'a [MemberId],
    /// Redis time of the write (the `updatedAt` field).
    pub now_ms: u64,
    /// The server's run id, recorded with the aggregate.
    pub run_id: &'a str,
    /// A group's changed fields (bumps `revision`); groups write these, never `aggregate`.
    pub fields: Option<&'a FieldWrite>,
}

/// The fields a group commit writes.
#[derive(Debug, Default)]
pub struct FieldWrite {
    /// (field, JSON to write or `None` to delete, the stored field's digest the decision read, empty when the
    /// field must not exist).
    pub changes: Vec<(String, Option<String>, String)>,
    /// SHA-1 of the `aggregate` this write converts to fields (the layout before them); empty otherwise.
    pub converts: String,
}

/// Result of `COMMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Written; the hash's revision now.
    Ok(StoreRevision),
    /// Another writer got there first: reload and decide again.
    Conflict,
}

/// A mutex token of this store, registered as live until dropped.
///
/// Every token starts with its store's owner id: a mutex that carries this store's id but no live token is a
/// leftover of this process (a section that failed or was cancelled before its release, or a mutex Redis brought
/// back from its append-only file after a restart), which nobody can be using, so it is deleted instead of
/// waited out. Mutexes of other owners are only ever waited for: they may belong to a live section.
#[derive(Debug)]
pub struct Token {
    pub(super) value: String,
    pub(super) live: Arc<StdMutex<HashSet<String>>>,
}

impl std::ops::Deref for Token {
    type Target = str;

    fn deref(&self) -> &str {
        &self.value
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(&self.value);
        }
    }
}
