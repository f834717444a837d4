//! The documents the coordinator records in Redis: a group's aggregate and a stream's routing.
//!
//! Both carry a `schemaVersion`; a coordinator that reads a version it does not know fails closed (see
//! [`GroupMetadata::decode`]) instead of guessing.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use crate::error::DecodeError;
use crate::names::{GroupName, MemberId, StreamName};
use crate::reshard::{GroupReshard, Growth, MAX_RECORDED_GROWTHS};
use crate::version::{
    AssignmentEpoch, FencingToken, Incarnation, MemberEpoch, MetadataVersion, RoutingVersion, ShardId,
};

/// Schema version of [`GroupMetadata`] written by this build.
pub const GROUP_SCHEMA_VERSION: u32 = 1;
/// Schema version of [`StreamRouting`] written by this build.
pub const ROUTING_SCHEMA_VERSION: u32 = 1;
/// Most shards a stream may have.
pub const MAX_SHARDS: u32 = 65_536;

/// Timings of a group. All in milliseconds.
///
/// Rules ([`GroupTimings::validate`]): `heartbeat_interval < assignment_lease <= member_ttl`, and
/// `rebalance_timeout >= heartbeat_interval`. The assignment lease is what a consumer may read for without a
/// fresh answer, measured from the *send* time of the heartbeat; keeping it at or below the member TTL means a
/// consumer stops reading before the coordinator can expire it and hand its shards to someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupTimings {
    /// How long a member stays alive without a heartbeat.
    pub member_ttl_ms: u64,
    /// How often members heartbeat.
    pub heartbeat_interval_ms: u64,
    /// How long a member may take to drain a revoked shard before it is fenced.
    pub rebalance_timeout_ms: u64,
    /// How long a consumer may read without a successful heartbeat.
    pub assignment_lease_ms: u64,
}

impl Default for GroupTimings {
    fn default() -> Self {
        GroupTimings {
            member_ttl_ms: 10_000,
            heartbeat_interval_ms: 2_000,
            rebalance_timeout_ms: 30_000,
            assignment_lease_ms: 8_000,
        }
    }
}

impl GroupTimings {
    /// Checks the cross-field rules.
    ///
    /// # Errors
    /// A sentence naming the broken rule.
    pub fn validate(&self) -> Result<(), String> {
        let t = self;
        if t.heartbeat_interval_ms == 0 {
            return Err("heartbeatIntervalMs must be positive".into());
        }
        if t.member_ttl_ms > 24 * 3_600_000 || t.rebalance_timeout_ms > 24 * 3_600_000 {
            return Err("timings above 24 hours are refused".into());
        }
        if t.assignment_lease_ms <= t.heartbeat_interval_ms {
            return Err(format!(
                "assignmentLeaseMs ({}) must be greater than heartbeatIntervalMs ({})",
                t.assignment_lease_ms, t.heartbeat_interval_ms
            ));
        }
        if t.assignment_lease_ms > t.member_ttl_ms {
            return Err(format!(
                "assignmentLeaseMs ({}) must not exceed memberTtlMs ({}): a consumer must stop reading before it \
                 can be expired",
                t.assignment_lease_ms, t.member_ttl_ms
            ));
        }
        if t.rebalance_timeout_ms < t.heartbeat_interval_ms {
            return Err(format!(
                "rebalanceTimeoutMs ({}) must be at least heartbeatIntervalMs ({})",
                t.rebalance_timeout_ms, t.heartbeat_interval_ms
            ));
        }
        Ok(())
    }
}

/// A group's aggregate: the one JSON document in the `aggregate` field of its metadata hash.
///
/// Every coordinator decision is written here before any response depends on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupMetadata {
    /// [`GROUP_SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// The stream.
    pub stream: StreamName,
    /// The group.
    pub group: GroupName,
    /// +1 on every committed change (held still while a correction round is open).
    pub metadata_version: MetadataVersion,
    /// +1 on every change of the target assignment.
    pub assignment_epoch: AssignmentEpoch,
    /// The stream routing version this group has adopted.
    pub routing_version: RoutingVersion,
    /// The shard count this group has adopted; `shards.len()`.
    pub shard_count: u32,
    /// The group's timings.
    pub timings: GroupTimings,
    /// Redis time (ms) the group was created.
    pub created_at_ms: u64,
    /// Members by id.
    pub members: BTreeMap<MemberId, MemberRecord>,
    /// Per-shard target and owner, indexed by shard id.
    pub shards: Vec<ShardRecord>,
    /// The open metadata correction round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction: Option<CorrectionRound>,
    /// Growths adopted and not finished, oldest first: their children are held (see [`docs/resharding.md`]).
    /// Absent when none is open, so a group that never grew writes exactly what older builds wrote.
    ///
    /// [`docs/resharding.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/resharding.md
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reshards: Vec<GroupReshard>,
    /// The highest incarnation minted for this group (0 before the first join under a build with incarnations).
    /// A new one is above it, so no incarnation is minted twice in one history.
    #[serde(default, skip_serializing_if = "is_no_incarnation")]
    pub last_incarnation: Incarnation,
    /// A correction round has closed since the coordinator last saw a loss itself (a new Redis run id, a version
    /// below one it saw, a missing liveness hash). Until it sees one again, a version a client reports above the
    /// stored one opens no further round: the closed round already retired every version of that history, so a
    /// higher report is a version no coordinator issued (a damaged version store, a hostile client).
    #[serde(default, skip_serializing_if = "is_false")]
    pub reports_settled: bool,
}

fn is_no_incarnation(i: &Incarnation) -> bool {
    *i == Incarnation::NONE
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What Redis records about one member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberRecord {
    /// Id of the process that joined.
    pub instance_id: String,
    /// The incarnation its join created; requests that name another change nothing. 0 for a member recorded by
    /// a build without incarnations (its process cannot name it: it rejoins once).
    #[serde(default)]
    pub incarnation: Incarnation,
    /// The incarnation the creating join named (the one its process held before): a join from the same process
    /// naming it again is a retry of that join, one naming an older one a late copy of an earlier join.
    #[serde(default, skip_serializing_if = "is_no_incarnation")]
    pub joined_after: Incarnation,
    /// Current epoch.
    pub epoch: MemberEpoch,
    /// The epoch before the last bump; a heartbeat carrying it is a retry after a lost response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_epoch: Option<MemberEpoch>,
    /// Redis time (ms) of the join.
    pub joined_at_ms: u64,
    /// Lease end recorded with the last aggregate write (the liveness hash may hold a later one).
    pub lease_until_ms: u64,
    /// Set when the member was fenced (rebalance timeout or admin); it is removed when its lease ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_at_ms: Option<u64>,
    /// Until this time a previous incarnation of this member may still be reading the shards it owns: they are
    /// neither readable by the new incarnation nor released by its acks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until_ms: Option<u64>,
    /// Since when the member has had a shard to drain (for the rebalance timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoking_since_ms: Option<u64>,
}

/// Target and current owner of one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShardRecord {
    /// Member the assignor wants to own the shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<MemberId>,
    /// Member that owns it now: it may read it (if also the target) or must drain it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<MemberId>,
    /// While the owner must drain it: the lowest `metadataVersion` an answer telling the owner so can carry. A
    /// `REVOKED` ack from a request with a lower version was sent before the owner was told (a late or duplicated
    /// request) and is ignored. Absent in metadata of older builds: acks are then not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoke_since_version: Option<MetadataVersion>,
    /// The token minted when the current owner got the shard (or the last owner's, while it has none); 0 before
    /// the shard's first owner. Only ever grows: see [`docs/fencing.md`].
    ///
    /// [`docs/fencing.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/fencing.md
    #[serde(default, skip_serializing_if = "is_zero_token")]
    pub fencing_token: FencingToken,
}

fn is_zero_token(t: &FencingToken) -> bool {
    t.0 == 0
}

/// An open metadata correction round (see [`docs/protocol.md`]).
///
/// [`docs/protocol.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/protocol.md
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CorrectionRound {
    /// Redis time (ms) the round started.
    pub started_at_ms: u64,
    /// The highest version a client reported.
    pub reported_max_version: MetadataVersion,
    /// Members that heartbeated with the stored version since the round started.
    #[serde(default)]
    pub synced: BTreeSet<MemberId>,
    /// Shards some member reported reading or draining although Redis records another owner, by shard.
    #[serde(default)]
    pub claims: BTreeMap<ShardId, BTreeSet<MemberId>>,
}

impl GroupMetadata {
    /// A new, empty group at metadata version 1.
    pub fn new(
        stream: StreamName,
        group: GroupName,
        shard_count: u32,
        routing_version: RoutingVersion,
        timings: GroupTimings,
        now_ms: u64,
    ) -> Self {
        GroupMetadata {
            schema_version: GROUP_SCHEMA_VERSION,
            stream,
            group,
            metadata_version: MetadataVersion(1),
            assignment_epoch: AssignmentEpoch(1),
            routing_version,
            shard_count,
            timings,
            created_at_ms: now_ms,
            members: BTreeMap::new(),
            shards: vec![ShardRecord::default(); shard_count as usize],
            correction: None,
            reshards: Vec::new(),
            last_incarnation: Incarnation::NONE,
            reports_settled: false,
        }
    }

    /// Parses a stored aggregate, refusing unknown schema versions and inconsistent documents.
    ///
    /// # Errors
    /// [`DecodeError`] for malformed JSON, an unknown schema version, or a broken invariant.
    pub fn decode(json: &[u8]) -> Result<Self, DecodeError> {
        check_schema(json, GROUP_SCHEMA_VERSION)?;
        let meta: GroupMetadata = serde_json::from_slice(json)?;
        meta.validate()?;
        Ok(meta)
    }

    /// The JSON stored in Redis.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("GroupMetadata serializes: it holds only strings, numbers and maps")
    }

    /// Checks the invariants every stored group holds (shard table length, members named by shards exist,
    /// incarnations, fencing tokens, timings, reshards): what [`GroupMetadata::decode`] checks after parsing, for
    /// a document assembled from parts.
    ///
    /// # Errors
    /// [`DecodeError::Inconsistent`] naming the broken invariant.
    pub fn validate(&self) -> Result<(), DecodeError> {
        if self.shards.len() != self.shard_count as usize {
            return Err(DecodeError::Inconsistent(format!(
                "shardCount is {} but the shard table has {} entries",
                self.shard_count,
                self.shards.len()
            )));
        }
        for (i, s) in self.shards.iter().enumerate() {
            for m in s.target.iter().chain(s.owner.iter()) {
                if !self.members.contains_key(m) {
                    return Err(DecodeError::Inconsistent(format!("shard {i} names unknown member {m}")));
                }
            }
        }
        if self.last_incarnation > Incarnation::MAX {
            return Err(DecodeError::Inconsistent("lastIncarnation is above 2^53 - 1".into()));
        }
        for (id, m) in &self.members {
            if m.incarnation > self.last_incarnation || m.joined_after >= m.incarnation.max(Incarnation(1)) {
                return Err(DecodeError::Inconsistent(format!(
                    "member {id} has incarnation {} (joined after {}) beyond the group's last incarnation {}",
                    m.incarnation, m.joined_after, self.last_incarnation
                )));
            }
        }
        if let Some(i) = self.shards.iter().position(|s| s.fencing_token > FencingToken::MAX) {
            return Err(DecodeError::Inconsistent(format!(
                "shard {i} has a fencing token above 2^53 - 1"
            )));
        }
        self.timings.validate().map_err(DecodeError::Inconsistent)?;
        if self.reshards.len() > MAX_RECORDED_GROWTHS {
            return Err(DecodeError::Inconsistent(format!(
                "{} open reshards, at most {MAX_RECORDED_GROWTHS}",
                self.reshards.len()
            )));
        }
        for r in &self.reshards {
            r.check(self.shard_count).map_err(DecodeError::Inconsistent)?;
        }
        if self
            .reshards
            .windows(2)
            .any(|w| w[0].routing_version >= w[1].routing_version)
        {
            return Err(DecodeError::Inconsistent(
                "reshards are not in routing-version order".into(),
            ));
        }
        Ok(())
    }
}

/// A stream's routing: the `aggregate` of its routing hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StreamRouting {
    /// [`ROUTING_SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// The stream.
    pub stream: StreamName,
    /// +1 on every committed change.
    pub routing_version: RoutingVersion,
    /// Number of shards.
    pub shard_count: u32,
    /// How long producers may use this routing without a successful refresh.
    pub routing_lease_ms: u64,
    /// Redis time (ms) the routing was created.
    pub created_at_ms: u64,
    /// The last growths (add-shards), oldest first, with their parents' seal positions (at most
    /// [`MAX_RECORDED_GROWTHS`]). Absent for a stream that never grew under this build.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub growths: Vec<Growth>,
    /// Every shard of this routing has its record (`bornVersion` in its fence hash, see
    /// [`crate::keys::shard_fence_fields`]): fenced producers may refuse a shard without one. Absent for a stream
    /// whose records the coordinator has not written yet (created before shard records existed).
    #[serde(default, skip_serializing_if = "is_false")]
    pub shard_records: bool,
    /// A client's report restored this routing since the coordinator last saw a loss of the routing hash itself
    /// (a new Redis run id): until it sees one again, a higher report restores nothing (at most one restoration
    /// per Redis history from what clients say; Redis's own records are always believed).
    #[serde(default, skip_serializing_if = "is_false")]
    pub reports_settled: bool,
}

/// Default routing lease given to producers.
pub const DEFAULT_ROUTING_LEASE_MS: u64 = 30_000;

impl StreamRouting {
    /// New routing at version 1.
    pub fn new(stream: StreamName, shard_count: u32, now_ms: u64) -> Self {
        StreamRouting {
            schema_version: ROUTING_SCHEMA_VERSION,
            stream,
            routing_version: RoutingVersion(1),
            shard_count,
            routing_lease_ms: DEFAULT_ROUTING_LEASE_MS,
            created_at_ms: now_ms,
            growths: Vec::new(),
            shard_records: false,
            reports_settled: false,
        }
    }

    /// Parses a stored routing document, refusing unknown schema versions.
    ///
    /// # Errors
    /// [`DecodeError`] for malformed JSON, an unknown schema version or a zero shard count.
    pub fn decode(json: &[u8]) -> Result<Self, DecodeError> {
        check_schema(json, ROUTING_SCHEMA_VERSION)?;
        let r: StreamRouting = serde_json::from_slice(json)?;
        if r.routing_version > RoutingVersion(MetadataVersion::MAX_SAFE.0) {
            return Err(DecodeError::Inconsistent("routingVersion above 2^53 - 1".into()));
        }
        if r.shard_count == 0 || r.shard_count > MAX_SHARDS {
            return Err(DecodeError::Inconsistent(format!(
                "shardCount {} out of range",
                r.shard_count
            )));
        }
        if r.growths.len() > MAX_RECORDED_GROWTHS {
            return Err(DecodeError::Inconsistent(format!(
                "{} growths recorded, at most {MAX_RECORDED_GROWTHS}",
                r.growths.len()
            )));
        }
        for g in &r.growths {
            g.check().map_err(DecodeError::Inconsistent)?;
            if g.shard_count > r.shard_count || g.routing_version > r.routing_version {
                return Err(DecodeError::Inconsistent(format!(
                    "growth {} is beyond the routing (version {}, {} shards)",
                    g.routing_version, r.routing_version, r.shard_count
                )));
            }
        }
        if r.growths
            .windows(2)
            .any(|w| w[0].routing_version >= w[1].routing_version)
        {
            return Err(DecodeError::Inconsistent(
                "growths are not in routing-version order".into(),
            ));
        }
        Ok(r)
    }

    /// The JSON stored in Redis.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("StreamRouting serializes: it holds only strings and numbers")
    }
}

/// Reads a document's schema version before the document, so a future document fails as "unsupported", not as
/// "malformed".
fn check_schema(json: &[u8], supported: u32) -> Result<(), DecodeError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        schema_version: u32,
    }
    let probe: Probe = serde_json::from_slice(json)?;
    if probe.schema_version != supported {
        return Err(DecodeError::UnsupportedSchema {
            found: probe.schema_version,
            supported,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> GroupMetadata {
        GroupMetadata::new(
            StreamName::new("s").unwrap(),
            GroupName::new("g").unwrap(),
            2,
            RoutingVersion(1),
            GroupTimings::default(),
            5,
        )
    }

    #[test]
    fn round_trips() {
        let m = meta();
        assert_eq!(GroupMetadata::decode(m.encode().as_bytes()).unwrap(), m);
    }

    #[test]
    fn unknown_schema_fails_closed() {
        let json = meta().encode().replace("\"schemaVersion\":1", "\"schemaVersion\":2");
        assert!(matches!(
            GroupMetadata::decode(json.as_bytes()),
            Err(DecodeError::UnsupportedSchema { found: 2, supported: 1 })
        ));
    }

    #[test]
    fn inconsistent_shard_table_is_refused() {
        let json = meta().encode().replace("\"shardCount\":2", "\"shardCount\":3");
        assert!(matches!(
            GroupMetadata::decode(json.as_bytes()),
            Err(DecodeError::Inconsistent(_))
        ));
        let json = meta().encode().replace("[{},{}]", "[{\"owner\":\"ghost\"},{}]");
        assert!(matches!(
            GroupMetadata::decode(json.as_bytes()),
            Err(DecodeError::Inconsistent(_))
        ));
    }

    #[test]
    fn fencing_tokens_round_trip_and_are_bounded() {
        let mut m = meta();
        m.shards[1].fencing_token = FencingToken(1_700_000_000_000);
        let json = m.encode();
        assert!(json.contains("[{},{\"fencingToken\":1700000000000}]"), "{json}");
        assert_eq!(GroupMetadata::decode(json.as_bytes()).unwrap(), m);
        let json = json.replace("1700000000000", &(1u64 << 53).to_string());
        assert!(matches!(
            GroupMetadata::decode(json.as_bytes()),
            Err(DecodeError::Inconsistent(_))
        ));
    }

    #[test]
    fn garbage_is_malformed() {
        assert!(matches!(GroupMetadata::decode(b"{not json"), Err(DecodeError::Json(_))));
        assert!(matches!(StreamRouting::decode(b"[]"), Err(DecodeError::Json(_))));
    }

    #[test]
    fn timing_rules() {
        assert!(GroupTimings::default().validate().is_ok());
        let t = GroupTimings {
            assignment_lease_ms: 20_000,
            ..GroupTimings::default()
        };
        assert!(t.validate().unwrap_err().contains("must not exceed memberTtlMs"));
        let t = GroupTimings {
            heartbeat_interval_ms: 9_000,
            ..GroupTimings::default()
        };
        assert!(t.validate().is_err());
        let t = GroupTimings {
            rebalance_timeout_ms: 1,
            ..GroupTimings::default()
        };
        assert!(t.validate().is_err());
    }
}
