//! The modelled Redis: the routing hash and, per shard, one hash slot (the shard's record and its stream), what
//! a failover keeps, and how the model prints them.

use protocol::keys::LAYOUT_VERSION;
use protocol::metadata::StreamRouting;
use protocol::reshard::{Birth, EntryId};
use protocol::StoreRevision;
use std::collections::BTreeMap;

use crate::store::{self, Loaded};

/// A stream entry: the key, and the routing the producer wrote it with (ghost fields: `producer`, `seq`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: EntryId,
    pub key: u8,
    /// The producer's routing version and shard count.
    pub version: u64,
    pub count: u32,
    pub producer: u8,
    /// The order of the write among all writes of the path (ghost: per-key order across shards).
    pub seq: u32,
    /// Ghost: the shard count `version` had in the history of the routing hash when the write was made (`None`:
    /// that history had not committed it; a restore the coordinator cannot see lets a later growth issue it).
    pub meant: Option<u32>,
}

/// One shard's hash slot: its record (the fence hash: `routingVersion`, `bornVersion`, `bornParents`,
/// `seal:<v>`) and its stream. On a Cluster they live and are lost together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardSide {
    /// `routingVersion`: the lowest version a producer must hold to write here (0: no fence).
    pub fence: u64,
    /// `fenceCount`: the shard count of the layout at the fence (0: none).
    pub fence_count: u32,
    /// `bornCount`: the shard count of the layout that created the shard (0: no record).
    pub born_count: u32,
    /// `bornVersion`, `bornParents`; `None`: no record.
    pub born: Option<(u64, u32)>,
    /// `seal:<v>` fields.
    pub seals: BTreeMap<u64, EntryId>,
    pub entries: Vec<Entry>,
}

impl ShardSide {
    pub(super) fn last_id(&self) -> EntryId {
        self.entries.last().map_or(EntryId::ZERO, |e| e.id)
    }
}

/// The routing hash: the document, its revision, the run id it was written under, and (ghost) every routing
/// committed in the line of writes this content comes from: what each version means in this history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingHash {
    pub routing: StreamRouting,
    pub revision: u64,
    pub written_by: u32,
    pub lineage: BTreeMap<u64, u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redis {
    pub routing: RoutingHash,
    pub shards: Vec<ShardSide>,
}

/// What a failover would keep: `None` where the replica is in sync, else the copy it stopped at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replicas {
    /// One node: the whole Redis.
    pub node: Option<Box<Redis>>,
    /// Cluster: the routing hash's master.
    pub routing: Option<RoutingHash>,
    /// Cluster: shard masters.
    pub shards: BTreeMap<u32, ShardSide>,
}

pub(super) fn loaded_of(hash: Option<&RoutingHash>, run: u32, now: u64) -> Loaded {
    Loaded {
        now_ms: now,
        revision: hash.map(|h| StoreRevision(h.revision)),
        liveness_revision: 0,
        schema_version: Some(store::schema_of_routing()),
        layout_version: Some(LAYOUT_VERSION),
        aggregate: hash.map(|h| h.routing.encode().into_bytes()),
        group: None,
        aggregate_digest: String::new(),
        cache_hit: false,
        liveness: Vec::new(),
        stored_run_id: hash.map_or(String::new(), |h| run_name(h.written_by)),
        run_id: run_name(run),
        liveness_missing: false,
    }
}

pub(super) fn run_name(run: u32) -> String {
    format!("{run:040x}")
}

/// `store::reshard::RECORD`: a record is never rewritten.
pub(super) fn write_records(shards: &mut [ShardSide], records: &[Birth]) -> String {
    let mut text = Vec::new();
    for b in records {
        let side = &mut shards[b.shard.0 as usize];
        if side.born.is_none() {
            side.born = Some((b.born.0, b.parents));
            side.born_count = b.count;
            text.push(format!("{}:born v{}", b.shard.0, b.born.0));
        } else {
            text.push(format!("{}:kept", b.shard.0));
        }
    }
    format!("[{}]", text.join(" "))
}

pub(super) fn shards(n: u32) -> String {
    format!("{n} shard{}", if n == 1 { "" } else { "s" })
}

pub(super) fn pos(p: EntryId) -> String {
    if p == EntryId::ZERO {
        "(0-0)".to_owned()
    } else {
        format!("({}-{})", p.ms, p.seq)
    }
}

pub fn describe(r: &StreamRouting) -> String {
    let growths: Vec<String> = r
        .growths
        .iter()
        .map(|g| format!("v{}:{}->{}", g.routing_version, g.parents, g.shard_count))
        .collect();
    format!(
        "v{} {} [{}]{}",
        r.routing_version,
        shards(r.shard_count),
        growths.join(","),
        if r.reports_settled { " settled" } else { "" }
    )
}

pub(super) fn describe_side(s: u32, side: &ShardSide) -> String {
    let entries: Vec<String> = side
        .entries
        .iter()
        .map(|e| format!("{}#{}(v{}/{})", key_name(e.key), e.seq, e.version, e.count))
        .collect();
    format!(
        "shard {s}: fence {}/{} born {:?}/{} seals {:?} entries [{}]",
        side.fence,
        side.fence_count,
        side.born,
        side.born_count,
        side.seals.keys().collect::<Vec<_>>(),
        entries.join(" ")
    )
}

/// The name of the model's key `k` in a printout.
pub(super) fn key_name(k: u8) -> &'static str {
    ["a", "b"][k as usize]
}
