//! A group's metadata hash in fields (`schemaVersion` 2): what a change writes, and how a load of some or all of
//! the fields becomes a checked [`GroupMetadata`] again.
//!
//! | field | holds |
//! |---|---|
//! | `group` | everything but the members and the shard table (versions, timings, correction round, reshards) |
//! | `m:<member id>` | one [`MemberRecord`] |
//! | `s:<k>` | the [`ShardRecord`]s of shards `16k .. 16k + 15` ([`SHARDS_PER_BLOCK`]) |
//! | `log:<revision>` | the fields the commit of that revision wrote (`name`) or deleted (`-name`), space-separated; the last [`LOG_KEEP`] are kept |
//!
//! Every data field's value is `<revision>:<json>`: the revision of the commit that wrote it (its stamp). A change
//! writes only the fields it changes, a log entry and the revision, in one script; a coordinator that holds
//! revision `r` reads only the log entries after `r` and the fields they name.
//!
//! Why a stamp and a log: a field is never trusted alone. A load checks every field it reads (canonical stamp,
//! strict JSON, known name) and that fields and log agree: no stamp above the revision (written without its
//! revision), every field a kept log entry names carries that entry's stamp or, deleted, is gone (a change cut
//! between two fields), the log entry of the revision itself exists; then the assembled metadata passes the same
//! invariants as a whole document ([`GroupMetadata::validate`]). Anything else is corrupt metadata: the group
//! fails closed, as for a corrupt aggregate.
//!
//! Why blocks of 16 shards: one field per shard would cost a hash entry's overhead (about 60 bytes in Redis) per
//! shard; one field for all would rewrite the table on every move. A block is about 1 KB at 16 owned shards, so
//! a change that moves one shard writes about 1 KB of shard table.

use protocol::metadata::{CorrectionRound, GroupMetadata, GroupTimings, MemberRecord, ShardRecord, MAX_SHARDS};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::reshard::GroupReshard;
use protocol::{AssignmentEpoch, Incarnation, MetadataVersion, RoutingVersion, StoreRevision};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Shards per `s:<k>` field.
pub const SHARDS_PER_BLOCK: usize = 16;
/// How many log entries a hash keeps: a coordinator at most this many revisions behind loads only the changes.
pub const LOG_KEEP: u64 = 64;
/// The field of the group-level document.
pub const HEAD: &str = "group";
/// The hash's `schemaVersion` of this layout.
pub const FIELDS_SCHEMA: u32 = 2;
/// The hash's `schemaVersion` of the layout before it: the whole document in the `aggregate` field. Loaded and
/// converted on the group's next section.
pub const AGGREGATE_SCHEMA: u32 = 1;

/// The field of member `id`.
pub fn member_field(id: &MemberId) -> String {
    format!("m:{id}")
}

/// The field of shard block `k`.
pub fn block_field(k: usize) -> String {
    format!("s:{k}")
}

/// The field of the log entry of `revision`.
pub fn log_field(revision: u64) -> String {
    format!("log:{revision}")
}

/// The 64-bit digest of a stored field as the scripts compute it: the first 16 hex digits of the SHA-1 of
/// `name`, a newline and the stored value.
pub fn field_digest(name: &str, stored: &[u8]) -> u64 {
    let mut h = sha1_smol::Sha1::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update(stored);
    let bytes = h.digest().bytes();
    u64::from_be_bytes(bytes[..8].try_into().expect("a SHA-1 has 20 bytes"))
}

/// The checksum of the shard blocks' stored lengths (in block order) as the load script computes it:
/// `h = (h * 1000003 + length) mod (2^31 - 1)` from 0. A single length change always changes it (the modulus is a
/// prime above any length difference); changes of several blocks at once cancel out with odds of about 2^-31,
/// and the minute's digest of every field catches those.
pub fn block_lengths_checksum(lens: &[usize]) -> u64 {
    lens.iter().fold(0, |h, l| (h * 1_000_003 + *l as u64) % 2_147_483_647)
}

/// A digest as the scripts write it (16 lowercase hex digits).
pub fn digest_hex(d: u64) -> String {
    format!("{d:016x}")
}

/// The group-level document (`group` field), borrowed for writing.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HeadRef<'a> {
    schema_version: u32,
    stream: &'a StreamName,
    group: &'a GroupName,
    metadata_version: MetadataVersion,
    assignment_epoch: AssignmentEpoch,
    routing_version: RoutingVersion,
    shard_count: u32,
    timings: &'a GroupTimings,
    created_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    correction: &'a Option<CorrectionRound>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reshards: &'a Vec<GroupReshard>,
    last_incarnation: Incarnation,
    reports_settled: bool,
}

impl<'a> HeadRef<'a> {
    fn of(meta: &'a GroupMetadata) -> Self {
        // Destructured in full: a field added to the document fails to compile here until it has a place.
        let GroupMetadata {
            schema_version,
            stream,
            group,
            metadata_version,
            assignment_epoch,
            routing_version,
            shard_count,
            timings,
            created_at_ms,
            members: _,
            shards: _,
            correction,
            reshards,
            last_incarnation,
            reports_settled,
        } = meta;
        HeadRef {
            schema_version: *schema_version,
            stream,
            group,
            metadata_version: *metadata_version,
            assignment_epoch: *assignment_epoch,
            routing_version: *routing_version,
            shard_count: *shard_count,
            timings,
            created_at_ms: *created_at_ms,
            correction,
            reshards,
            last_incarnation: *last_incarnation,
            reports_settled: *reports_settled,
        }
    }

    fn encode(&self) -> String {
        serde_json::to_string(self).expect("a group head holds only strings, numbers and maps")
    }
}

/// The group-level document, read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Head {
    schema_version: u32,
    stream: StreamName,
    group: GroupName,
    metadata_version: MetadataVersion,
    assignment_epoch: AssignmentEpoch,
    routing_version: RoutingVersion,
    shard_count: u32,
    timings: GroupTimings,
    created_at_ms: u64,
    #[serde(default)]
    correction: Option<CorrectionRound>,
    #[serde(default)]
    reshards: Vec<GroupReshard>,
    last_incarnation: Incarnation,
    reports_settled: bool,
}

impl Head {
    fn into_metadata(self, members: BTreeMap<MemberId, MemberRecord>, shards: Vec<ShardRecord>) -> GroupMetadata {
        GroupMetadata {
            schema_version: self.schema_version,
            stream: self.stream,
            group: self.group,
            metadata_version: self.metadata_version,
            assignment_epoch: self.assignment_epoch,
            routing_version: self.routing_version,
            shard_count: self.shard_count,
            timings: self.timings,
            created_at_ms: self.created_at_ms,
            members,
            shards,
            correction: self.correction,
            reshards: self.reshards,
            last_incarnation: self.last_incarnation,
            reports_settled: self.reports_settled,
        }
    }
}

fn encode_block(shards: &[ShardRecord]) -> String {
    serde_json::to_string(shards).expect("shard records serialize")
}

fn encode_member(m: &MemberRecord) -> String {
    serde_json::to_string(m).expect("member records serialize")
}

fn blocks(shards: &[ShardRecord]) -> impl Iterator<Item = &[ShardRecord]> {
    shards.chunks(SHARDS_PER_BLOCK)
}

/// Every data field of `meta` (name, JSON): what a new hash, or a converted one, holds.
pub fn all_fields(meta: &GroupMetadata) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(1 + meta.members.len() + meta.shards.len() / SHARDS_PER_BLOCK + 1);
    out.push((HEAD.to_owned(), HeadRef::of(meta).encode()));
    for (id, m) in &meta.members {
        out.push((member_field(id), encode_member(m)));
    }
    for (k, block) in blocks(&meta.shards).enumerate() {
        out.push((block_field(k), encode_block(block)));
    }
    out
}

/// The fields that differ between `old` and `new`: (name, `Some(json)` to write, `None` to delete).
pub fn changed_fields(old: &GroupMetadata, new: &GroupMetadata) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let head = HeadRef::of(new).encode();
    if HeadRef::of(old).encode() != head {
        out.push((HEAD.to_owned(), Some(head)));
    }
    for (id, m) in &new.members {
        if old.members.get(id) != Some(m) {
            out.push((member_field(id), Some(encode_member(m))));
        }
    }
    for id in old.members.keys().filter(|id| !new.members.contains_key(*id)) {
        out.push((member_field(id), None));
    }
    let old_blocks: Vec<&[ShardRecord]> = blocks(&old.shards).collect();
    let mut new_count = 0;
    for (k, block) in blocks(&new.shards).enumerate() {
        new_count = k + 1;
        if old_blocks.get(k) != Some(&block) {
            out.push((block_field(k), Some(encode_block(block))));
        }
    }
    for k in new_count..old_blocks.len() {
        out.push((block_field(k), None));
    }
    out
}

/// What this process knows of the stored data fields at one revision: each field's stamp and digest. A commit
/// names the digest of every field it overwrites or deletes, so it never replaces a field other than the one
/// its decision read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredFields {
    /// The revision they are at.
    pub revision: u64,
    /// Data field -> (stamp, digest, stored length in bytes).
    pub marks: HashMap<String, (u64, u64, usize)>,
    /// The revisions whose log entries the hash holds.
    pub logs: BTreeSet<u64>,
}

impl StoredFields {
    /// The XOR of every field's digest: what a tick's load compares with the stored fields (any edit of any
    /// field outside a commit shows).
    pub fn xor(&self) -> u64 {
        self.marks.values().fold(0, |acc, (_, d, _)| acc ^ d)
    }

    /// What a load that is not a tick compares before skipping the fields
    /// (`len:<data and log fields>:<length of group>:<blocks>:<block lengths>:<length of each member's field>,...`):
    /// a field deleted or added, or the group's, a loaded member's or any shard block's field replaced by one of
    /// another length, makes it read everything instead (and the full load then fails closed on what it cannot
    /// parse). An edit that keeps every length shows at the next tick's digest ([`StoredFields::xor`]).
    ///
    /// Every decision reads the whole shard table (a heartbeat reconciles against every shard's owner and
    /// target, a join reassigns them all), so every `s:` block is a field the load uses; `<block lengths>` is
    /// [`block_lengths_checksum`] of their lengths in block order. Why that and not the lengths themselves, or
    /// their sum: the lengths would put 4,096 numbers (some 20 KB) on every heartbeat of a group of 65,536
    /// shards, and a sum misses two edits that cancel out; the checksum is at most 10 digits whatever the shard
    /// count. The script's side is one `HSTRLEN` per block: O(shards / 16) Redis calls, each O(1), per load.
    pub fn shape(&self, members: &[&MemberId]) -> String {
        let len = |name: &str| self.marks.get(name).map_or(0, |(_, _, l)| *l);
        let lens: Vec<String> = members.iter().map(|m| len(&member_field(m)).to_string()).collect();
        // The blocks a resolved load holds are `s:0 .. s:<count - 1>` (a load checks it); a gap reads as length
        // 0, which no stored block has, so it cannot match. One pass over the marks, no name formatted: this
        // runs before every load.
        let blocks = self.marks.keys().filter(|n| n.starts_with("s:")).count();
        let mut block_lens = vec![0; blocks];
        for (name, (_, _, l)) in &self.marks {
            let k = name.strip_prefix("s:").and_then(|k| k.parse::<usize>().ok());
            if let Some(slot) = k.and_then(|k| block_lens.get_mut(k)) {
                *slot = *l;
            }
        }
        format!(
            "len:{}:{}:{blocks}:{}:{}",
            self.marks.len() + self.logs.len(),
            len(HEAD),
            block_lengths_checksum(&block_lens),
            lens.join(",")
        )
    }

    fn keep_logs(&mut self, revision: u64) {
        let oldest = revision.saturating_sub(LOG_KEEP);
        self.logs.retain(|r| *r > oldest);
    }

    /// The digest a commit expects of `name`: empty when the field must not exist.
    pub fn expected(&self, name: &str) -> String {
        self.marks.get(name).map(|(_, d, _)| digest_hex(*d)).unwrap_or_default()
    }

    /// The marks after a commit at `revision` wrote `changes`.
    pub fn after(&self, revision: u64, changes: &[(String, Option<String>)]) -> StoredFields {
        let mut next = self.clone();
        if changes.is_empty() || revision == self.revision {
            return next;
        }
        next.revision = revision;
        next.logs.insert(revision);
        next.keep_logs(revision);
        for (name, json) in changes {
            match json {
                Some(json) => {
                    let stored = format!("{revision}:{json}");
                    let mark = (revision, field_digest(name, stored.as_bytes()), stored.len());
                    next.marks.insert(name.clone(), mark);
                }
                None => {
                    next.marks.remove(name);
                }
            }
        }
        next
    }
}

/// What `LOAD` sent of a group's hash.
#[derive(Debug)]
pub enum GroupRead {
    /// The caller's cached revision is the stored one: nothing.
    Hit,
    /// Every field of the hash (header, data and log fields alike).
    Full(Vec<(String, Vec<u8>)>),
    /// The log entries after the cached revision and the fields they name, and the stored hash's shape.
    Delta(DeltaRead),
    /// The whole document of the layout before fields (`schemaVersion` 1).
    Aggregate(Vec<u8>),
}

/// What a delta load sent.
#[derive(Debug)]
pub struct DeltaRead {
    /// The log entries after the cached revision and the fields they name (`None`: the field is gone).
    pub fields: Vec<(String, Option<Vec<u8>>)>,
    /// The stored hash's count of data and log fields, length of `group` and shard blocks' lengths, in the form
    /// of [`StoredFields::shape`] without members: the marks after the changes must show the same, or a field
    /// the delta did not send (served from the cache) changed outside a commit.
    pub shape: String,
}

/// A load made whole: the metadata and its fields' marks.
pub type Resolved = (GroupMetadata, StoredFields);

/// The header fields of a group hash, read by the scripts on their own.
const HEADER: [&str; 6] = [
    "revision",
    "livenessRevision",
    "schemaVersion",
    "layoutVersion",
    "runId",
    "updatedAt",
];

/// One parsed data field.
enum Piece {
    Head(Box<Head>),
    Member(MemberId, MemberRecord),
    Block(usize, Vec<ShardRecord>),
}

/// Which field a name is.
enum Name {
    Header,
    Log(u64),
    Data,
}

fn classify(name: &str) -> Result<Name, String> {
    if HEADER.contains(&name) {
        return Ok(Name::Header);
    }
    if let Some(rev) = name.strip_prefix("log:") {
        return decimal(rev)
            .map(Name::Log)
            .ok_or_else(|| format!("field {name:?} is unknown"));
    }
    if name == HEAD || name.starts_with("m:") || name.starts_with("s:") {
        return Ok(Name::Data);
    }
    Err(format!("field {:?} is unknown", cut(name)))
}

fn cut(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A canonical decimal of at most 18 digits.
fn decimal(s: &str) -> Option<u64> {
    let ok =
        !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    ok.then(|| s.parse().ok()).flatten()
}

/// Splits a stored value into its stamp and JSON, and parses the JSON as the field's kind.
fn parse_field(name: &str, stored: &[u8], revision: u64) -> Result<(u64, Piece), String> {
    let bad = |why: String| format!("field {:?} {why}", cut(name));
    let colon = stored
        .iter()
        .position(|b| *b == b':')
        .ok_or_else(|| bad("has no stamp".into()))?;
    let stamp_text = std::str::from_utf8(&stored[..colon]).map_err(|_| bad("has no stamp".into()))?;
    let stamp = decimal(stamp_text).ok_or_else(|| bad(format!("has stamp {:?}", cut(stamp_text))))?;
    if stamp == 0 || stamp > revision {
        return Err(bad(format!(
            "was written at revision {stamp}, the hash is at {revision}: a write cut short or made outside a commit"
        )));
    }
    let json = &stored[colon + 1..];
    let piece = if name == HEAD {
        Piece::Head(Box::new(
            serde_json::from_slice(json).map_err(|e| bad(format!("is unreadable: {e}")))?,
        ))
    } else if let Some(id) = name.strip_prefix("m:") {
        let id = MemberId::new(id).map_err(|e| bad(format!("names an invalid member: {e}")))?;
        Piece::Member(
            id,
            serde_json::from_slice(json).map_err(|e| bad(format!("is unreadable: {e}")))?,
        )
    } else if let Some(k) = name.strip_prefix("s:") {
        let k = decimal(k).ok_or_else(|| bad("is unknown".into()))?;
        // No table holds a block past the last one of `MAX_SHARDS`: a name beyond it is not ours (and would
        // make a delta grow the table to it).
        let k = usize::try_from(k)
            .ok()
            .filter(|k| *k < (MAX_SHARDS as usize).div_ceil(SHARDS_PER_BLOCK))
            .ok_or_else(|| bad("is unknown".into()))?;
        Piece::Block(
            k,
            serde_json::from_slice(json).map_err(|e| bad(format!("is unreadable: {e}")))?,
        )
    } else {
        return Err(bad("is unknown".into()));
    };
    Ok((stamp, piece))
}

/// The log entries read: revision -> (field -> written (`true`) or deleted).
type Logs = BTreeMap<u64, BTreeMap<String, bool>>;

fn parse_log(rev: u64, value: &[u8], revision: u64, logs: &mut Logs) -> Result<(), String> {
    if rev == 0 || rev > revision {
        return Err(format!("log entry {rev} is beyond the hash's revision {revision}"));
    }
    let text = std::str::from_utf8(value).map_err(|_| format!("log entry {rev} is not text"))?;
    let mut entry = BTreeMap::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let (name, written) = match word.strip_prefix('-') {
            Some(name) => (name, false),
            None => (word, true),
        };
        if !matches!(classify(name), Ok(Name::Data)) {
            return Err(format!("log entry {rev} names {:?}", cut(name)));
        }
        entry.insert(name.to_owned(), written);
    }
    logs.insert(rev, entry);
    Ok(())
}

/// Checks fields against the log entries: the latest entry naming a field decides whether it exists and at
/// which stamp. `present` maps every field the check can see to its stamp.
fn check_against_logs(logs: &Logs, present: &HashMap<&str, u64>, names_complete: bool) -> Result<(), String> {
    let mut latest: HashMap<&str, (u64, bool)> = HashMap::new();
    for (rev, entry) in logs {
        for (name, written) in entry {
            latest.insert(name.as_str(), (*rev, *written));
        }
    }
    for (name, (rev, written)) in &latest {
        match (written, present.get(name)) {
            (true, Some(stamp)) if stamp == rev => {}
            (true, Some(stamp)) if stamp > rev => {}
            (false, None) => {}
            (false, Some(stamp)) if stamp > rev => {}
            (true, stamp) => {
                return Err(format!(
                    "field {name:?} was written at revision {rev} but holds {}: a change cut between fields",
                    stamp.map_or("nothing".to_owned(), |s| format!("revision {s}'s value"))
                ))
            }
            (false, Some(_)) => {
                return Err(format!(
                    "field {name:?} was deleted at revision {rev} but is still there: a change cut between fields"
                ))
            }
        }
    }
    if names_complete {
        // A stamp whose log entry is kept must be named by it.
        for (name, stamp) in present {
            if let Some(entry) = logs.get(stamp) {
                if entry.get(*name) != Some(&true) {
                    return Err(format!(
                        "field {name:?} carries revision {stamp}, whose log entry does not name it"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Makes a load whole: `read` at `revision`, over `cached` (the metadata and marks this process holds, for a
/// hit or a delta). The result passes [`GroupMetadata::validate`].
///
/// # Errors
/// A sentence for the `METADATA_UNAVAILABLE` answer: a field that does not parse, fields and log that disagree,
/// a missing log entry, a broken invariant.
pub fn resolve(
    read: &GroupRead,
    revision: StoreRevision,
    cached: Option<(&GroupMetadata, &StoredFields)>,
) -> Result<Resolved, String> {
    let revision = revision.0;
    match read {
        GroupRead::Hit => match cached {
            Some((meta, marks)) if marks.revision == revision => Ok((meta.clone(), marks.clone())),
            _ => Err("the load skipped fields this process does not hold".into()),
        },
        GroupRead::Aggregate(json) => {
            let meta = GroupMetadata::decode(json).map_err(|e| e.to_string())?;
            Ok((meta, StoredFields::default()))
        }
        GroupRead::Full(pairs) => full(pairs, revision),
        GroupRead::Delta(read) => {
            let Some((meta, marks)) = cached else {
                return Err("a delta load without a cached group".into());
            };
            let resolved = delta(&read.fields, revision, meta, marks)?;
            if resolved.1.shape(&[]) != read.shape {
                return Err(
                    "a field changed outside a commit: the stored fields' count or lengths are not the \
                     ones the changes leave"
                        .into(),
                );
            }
            Ok(resolved)
        }
    }
}

fn full(pairs: &[(String, Vec<u8>)], revision: u64) -> Result<Resolved, String> {
    let mut logs = Logs::new();
    let mut head = None;
    let mut members = BTreeMap::new();
    let mut blocks: BTreeMap<usize, Vec<ShardRecord>> = BTreeMap::new();
    let mut marks = HashMap::with_capacity(pairs.len());
    for (name, value) in pairs {
        match classify(name)? {
            Name::Header => {}
            Name::Log(rev) => parse_log(rev, value, revision, &mut logs)?,
            Name::Data => {
                let (stamp, piece) = parse_field(name, value, revision)?;
                marks.insert(name.clone(), (stamp, field_digest(name, value), value.len()));
                match piece {
                    Piece::Head(h) => head = Some(*h),
                    Piece::Member(id, m) => {
                        members.insert(id, m);
                    }
                    Piece::Block(k, b) => {
                        blocks.insert(k, b);
                    }
                }
            }
        }
    }
    if !logs.contains_key(&revision) {
        return Err(format!("the log entry of revision {revision} is missing"));
    }
    let present: HashMap<&str, u64> = marks.iter().map(|(n, (s, _, _))| (n.as_str(), *s)).collect();
    check_against_logs(&logs, &present, true)?;
    let head = head.ok_or("the group field is missing")?;
    let shards = assemble_shards(head.shard_count, blocks)?;
    let meta = head.into_metadata(members, shards);
    meta.validate()
        .map_err(|e| format!("group metadata is inconsistent: {e}"))?;
    let logs = logs.keys().copied().collect();
    Ok((meta, StoredFields { revision, marks, logs }))
}

fn assemble_shards(shard_count: u32, blocks: BTreeMap<usize, Vec<ShardRecord>>) -> Result<Vec<ShardRecord>, String> {
    let count = shard_count as usize;
    let want = count.div_ceil(SHARDS_PER_BLOCK);
    if blocks.len() != want || blocks.keys().next_back().is_some_and(|k| *k + 1 != want) {
        return Err(format!(
            "the shard table has {} blocks, {want} expected for {count} shards",
            blocks.len()
        ));
    }
    let mut shards = Vec::with_capacity(count);
    for (k, block) in blocks {
        let len = SHARDS_PER_BLOCK.min(count - k * SHARDS_PER_BLOCK);
        if block.len() != len {
            return Err(format!("shard block {k} has {} shards, {len} expected", block.len()));
        }
        shards.extend(block);
    }
    Ok(shards)
}

fn delta(
    pairs: &[(String, Option<Vec<u8>>)],
    revision: u64,
    cached: &GroupMetadata,
    cached_marks: &StoredFields,
) -> Result<Resolved, String> {
    let mut logs = Logs::new();
    let mut data = Vec::new();
    for (name, value) in pairs {
        match classify(name)? {
            Name::Log(rev) => {
                let value = value.as_deref().ok_or_else(|| format!("log entry {rev} is missing"))?;
                parse_log(rev, value, revision, &mut logs)?;
            }
            Name::Data => data.push((name, value)),
            Name::Header => return Err(format!("a delta load sent header field {name}")),
        }
    }
    let from = cached_marks.revision;
    if !(from + 1..=revision).all(|r| logs.contains_key(&r)) {
        return Err(format!("the log entries after revision {from} are incomplete"));
    }
    let mut meta = cached.clone();
    let mut marks = cached_marks.clone();
    marks.revision = revision;
    marks.logs.extend(logs.keys().copied());
    marks.keep_logs(revision);
    let mut present: HashMap<&str, u64> = HashMap::new();
    let mut new_head = None;
    for &(name, value) in &data {
        let Some(value) = value else {
            marks.marks.remove(name);
            if let Some(id) = name.strip_prefix("m:") {
                meta.members.retain(|m, _| m.as_str() != id);
            } else if name == HEAD {
                return Err("the group field is missing".into());
            }
            continue;
        };
        let (stamp, piece) = parse_field(name, value, revision)?;
        present.insert(name.as_str(), stamp);
        marks
            .marks
            .insert(name.clone(), (stamp, field_digest(name, value), value.len()));
        match piece {
            Piece::Head(h) => new_head = Some(*h),
            Piece::Member(id, m) => {
                meta.members.insert(id, m);
            }
            Piece::Block(k, b) => {
                let start = k * SHARDS_PER_BLOCK;
                if meta.shards.len() < start + b.len() {
                    meta.shards.resize(start + b.len(), ShardRecord::default());
                }
                meta.shards.splice(start..start + b.len(), b);
            }
        }
    }
    check_against_logs(&logs, &present, false)?;
    if let Some(head) = new_head {
        let members = std::mem::take(&mut meta.members);
        let shards = std::mem::take(&mut meta.shards);
        meta = head.into_metadata(members, shards);
    }
    let want = meta.shard_count as usize;
    if meta.shards.len() != want
        || marks.marks.keys().filter(|n| n.starts_with("s:")).count() != want.div_ceil(SHARDS_PER_BLOCK)
    {
        return Err(format!("the shard table does not hold {want} shards after the changes"));
    }
    meta.validate()
        .map_err(|e| format!("group metadata is inconsistent: {e}"))?;
    Ok((meta, marks))
}

#[cfg(test)]
#[path = "group_fields_tests.rs"]
mod tests;
