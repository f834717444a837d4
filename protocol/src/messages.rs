//! Request and response bodies of the coordinator's HTTP API (`/v1`), as JSON with camelCase fields.
//!
//! Every type here has a golden fixture in `protocol/testdata/messages/`; a test fails when the wire format
//! changes, so a change is always deliberate.

use serde::{Deserialize, Serialize};

use crate::metadata::{GroupTimings, MAX_SHARDS};
use crate::names::{GroupName, MemberId, StreamName};
use crate::status::Status;
use crate::version::{
    AssignmentEpoch, FencingToken, Incarnation, MemberEpoch, MetadataVersion, RoutingVersion, ShardId, StoreRevision,
};

/// Longest accepted `instanceId`, in bytes (the id is visible ASCII, so also in characters).
pub const MAX_INSTANCE_ID_LEN: usize = 64;

/// Bytes one shard takes at most in a heartbeat request: its `revoking` entry with a space after each `:` and `,`
/// (`{"shard": 65535, "state": "DRAINING"}, `), longer than its `owned` entry.
const MAX_HEARTBEAT_BYTES_PER_SHARD: usize = 40;

/// The largest body of a valid heartbeat request, in bytes (2,629,632): every shard a stream may have, each listed
/// once in `owned` or `revoking` at its longest, plus 8 KiB for the other fields (names, versions, an instance id
/// escaped character by character). The coordinator accepts heartbeat bodies up to this bound even when its
/// general body limit is smaller, so a member of the largest group can always report what it holds; a client
/// that sends more is refused with `413` before the body is buffered.
pub const MAX_HEARTBEAT_REQUEST_BYTES: usize = MAX_SHARDS as usize * MAX_HEARTBEAT_BYTES_PER_SHARD + 8192;

/// Largest version a client may send (2^53 - 1, the same bound as [`crate::MetadataVersion::MAX_SAFE`]): beyond it,
/// JSON numbers of other languages are not exact.
pub const MAX_WIRE_VERSION: u64 = (1 << 53) - 1;

/// Whether `id` is a valid `instanceId`: 1 to [`MAX_INSTANCE_ID_LEN`] visible ASCII characters, the document's
/// pattern. ASCII makes the length the same in characters (what JSON Schema counts) and in bytes (what is stored).
pub fn is_valid_instance_id(id: &str) -> bool {
    (1..=MAX_INSTANCE_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// `POST /v1/streams/{stream}/groups/{group}/heartbeat`: join (epoch 0), heartbeat, or leave (epoch -1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The member's id in the group.
    pub member_id: MemberId,
    /// Random id of this process (one per consumer instance). A join from another instance than the one the
    /// group records is a new incarnation whose predecessor may still read until its lease ends.
    pub instance_id: String,
    /// The incarnation this request speaks for. A heartbeat or a leave names the incarnation its join was given
    /// (the `incarnation` of the answers), and the coordinator applies it only to that incarnation: a request of
    /// an incarnation the group no longer records changes nothing and gets `UNKNOWN_MEMBER`. A join names the
    /// last incarnation this process held ([`Incarnation::NONE`] for its first): the same join retried after a
    /// lost answer names the same one and is answered as a retry; a join naming the recorded incarnation
    /// replaces it with a new one.
    pub incarnation: Incarnation,
    /// `0` to join, `-1` to leave, else the epoch of the last response.
    pub member_epoch: MemberEpoch,
    /// The metadata version of the last response the client applied.
    pub metadata_version: MetadataVersion,
    /// The highest metadata version the client has ever observed (kept by its version store).
    pub max_observed_version: MetadataVersion,
    /// Shards the client is reading now.
    #[serde(default)]
    pub owned: Vec<ShardId>,
    /// Shards in the client's local revoking state.
    #[serde(default)]
    pub revoking: Vec<RevokingShard>,
    /// The highest routing version the client has seen (answers' `routingVersion`, kept across processes by its
    /// version store); 0 when it reports none. Above the stored routing, the coordinator restores the routing
    /// (see [`docs/resharding.md`], "When Redis forgets a growth").
    ///
    /// [`docs/resharding.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/resharding.md
    #[serde(default, skip_serializing_if = "is_zero_routing")]
    pub max_routing_version: RoutingVersion,
    /// The highest shard count the client has seen; 0 when it reports none.
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub max_shard_count: u32,
}

fn is_zero_routing(v: &RoutingVersion) -> bool {
    v.0 == 0
}

fn is_zero_count(n: &u32) -> bool {
    *n == 0
}

/// An optional request field that, when present, holds a value: `null` is refused (the OpenAPI document types
/// these fields as non-nullable; absent is the one way to ask for the default). Serde calls this only for a
/// field that is present; `#[serde(default)]` gives `None` when it is absent.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A shard the client stopped reading, and whether its in-flight work is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevokingShard {
    /// The shard.
    pub shard: ShardId,
    /// Draining (work in flight) or revoked (released).
    pub state: RevokeState,
}

/// Progress of a local revoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RevokeState {
    /// No new reads; in-flight work still running.
    Draining,
    /// No new reads and no in-flight work: the coordinator may hand the shard to its next owner.
    Revoked,
}

/// Answer to a heartbeat with status `OK`, `SYNC_METADATA` or `REVOKE_PENDING`. A repeatable view of what Redis
/// records for this member: a lost response is repaired by the next heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatResponse {
    /// `OK`, `SYNC_METADATA` or `REVOKE_PENDING`.
    pub status: Status,
    /// The member.
    pub member_id: MemberId,
    /// The member's incarnation: every later request of this process names it, until it joins again.
    pub incarnation: Incarnation,
    /// The epoch to send next (`-1` after a leave).
    pub member_epoch: MemberEpoch,
    /// The group's metadata version in Redis.
    pub metadata_version: MetadataVersion,
    /// The assignment epoch of the current target assignment.
    pub assignment_epoch: AssignmentEpoch,
    /// Shards the member may read (only with status `OK` for shards it is not reading yet).
    pub assigned: Vec<ShardId>,
    /// The fencing token of each `assigned` shard, in the same order. Absent from the answers of coordinators
    /// older than fencing tokens.
    #[serde(default)]
    pub fencing_tokens: Vec<ShardToken>,
    /// Shards targeted to the member that a previous owner still holds: do not read yet.
    pub pending: Vec<ShardId>,
    /// Shards the member must drain and report `REVOKED` (the DRAIN instruction).
    pub revoke: Vec<ShardId>,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// How long, from the send time of this heartbeat, the member may keep reading without another answer.
    pub assignment_lease_ms: u64,
    /// Shard count the group has adopted.
    pub shard_count: u32,
    /// Routing version the group has adopted.
    pub routing_version: RoutingVersion,
}

/// The fencing token of one shard (see [`FencingToken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShardToken {
    /// The shard.
    pub shard: ShardId,
    /// Its fencing token.
    pub token: FencingToken,
}

/// Body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ErrorResponse {
    /// The error status.
    pub status: Status,
    /// What went wrong, for people.
    pub message: String,
    /// For `FENCED_MEMBER_EPOCH`: the epoch Redis records for the member, if it is still a member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_epoch: Option<MemberEpoch>,
    /// Suggested wait before retrying, for retryable errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// Query of `GET /v1/streams/{stream}/routing`: the producer's routing versions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutingQuery {
    /// The routing version the producer uses now (0 when it has none).
    #[serde(default)]
    pub routing_version: RoutingVersion,
    /// The highest routing version the producer has ever observed.
    #[serde(default)]
    pub max_observed_version: RoutingVersion,
    /// The highest shard count the producer has ever observed (0: none). With `maxObservedVersion`, what the
    /// coordinator restores when Redis lost a growth.
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub max_shard_count: u32,
}

impl RoutingQuery {
    /// Checks both versions against [`MAX_WIRE_VERSION`].
    ///
    /// # Errors
    /// A sentence naming the value out of range.
    pub fn validate(&self) -> Result<(), String> {
        if self.routing_version.0 > MAX_WIRE_VERSION || self.max_observed_version.0 > MAX_WIRE_VERSION {
            return Err("routingVersion and maxObservedVersion must be at most 2^53 - 1".into());
        }
        if self.max_shard_count > crate::metadata::MAX_SHARDS {
            return Err(format!("maxShardCount must be at most {}", crate::metadata::MAX_SHARDS));
        }
        Ok(())
    }
}

/// Answer of a routing fetch: `OK`, or `SYNC_METADATA` when the producer has observed a routing version higher
/// than Redis stores (adopt this one even though it is older, and count the event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutingResponse {
    /// `OK` or `SYNC_METADATA`.
    pub status: Status,
    /// The stream.
    pub stream: StreamName,
    /// The stored routing version.
    pub routing_version: RoutingVersion,
    /// Number of shards.
    pub shard_count: u32,
    /// How long, from the send time of this request, the producer may publish with this routing.
    pub routing_lease_ms: u64,
    /// How often to refresh even while publishing succeeds.
    pub refresh_interval_ms: u64,
    /// Every shard has its record: a fenced producer writes only into a shard whose record says it exists at its
    /// routing version (absent from older coordinators' answers: the fence alone is checked then).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shard_records: bool,
}

/// `POST /v1/streams/{stream}/groups/{group}`: create a group (and the stream's routing if it has none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateGroupRequest {
    /// Shard count of the stream. Required when the stream has no routing yet; when it has, must be absent or
    /// equal to the stored count.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub shard_count: Option<u32>,
    /// Timings of the group; defaults when absent (`null` is refused).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub timings: Option<GroupTimings>,
}

/// `POST /v1/streams/{stream}/groups/{group}/recreate`: recreate a group whose metadata was lost. Refused while
/// metadata exists. Members of the lost group get `UNKNOWN_MEMBER` and rejoin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecreateGroupRequest {
    /// Must be `true`: recreating is a deliberate operator action.
    pub confirm: bool,
    /// Shard count of the stream (must match the stream's routing when it still exists).
    pub shard_count: u32,
    /// Timings of the recreated group; defaults when absent (`null` is refused).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub timings: Option<GroupTimings>,
}

/// `POST /v1/streams/{stream}/shards`: grow a stream by `count` shards (bumps its routing version).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddShardsRequest {
    /// How many shards to add (at least 1).
    pub count: u32,
}

/// Admin view of a stream's routing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutingDescription {
    /// The stream.
    pub stream: StreamName,
    /// Store revision of the routing hash (its ETag).
    pub revision: StoreRevision,
    /// The routing version.
    pub routing_version: RoutingVersion,
    /// Number of shards.
    pub shard_count: u32,
    /// Routing lease producers get.
    pub routing_lease_ms: u64,
    /// Whether every shard has its record (see [`RoutingResponse::shard_records`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shard_records: bool,
    /// Shards whose record exists beyond `shardCount` (a growth Redis lost from the routing while the shards
    /// kept it): entries there are unread until the coordinator restores the growth (it does at its next tick).
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub shards_beyond_routing: u32,
    /// The highest fence on the stream's first shard, when above `routingVersion` (a growth Redis lost from the
    /// routing after it fenced the parents): fenced producers are refused until the routing is restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_above_routing: Option<RoutingVersion>,
}

/// Admin view of a group (`GET /v1/streams/{stream}/groups/{group}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupDescription {
    /// The stream.
    pub stream: StreamName,
    /// The group.
    pub group: GroupName,
    /// Store revision of the metadata hash (its ETag).
    pub revision: StoreRevision,
    /// The metadata version.
    pub metadata_version: MetadataVersion,
    /// The assignment epoch.
    pub assignment_epoch: AssignmentEpoch,
    /// The adopted routing version.
    pub routing_version: RoutingVersion,
    /// The adopted shard count.
    pub shard_count: u32,
    /// The group's timings.
    pub timings: GroupTimings,
    /// Members, by id.
    pub members: Vec<MemberDescription>,
    /// Shards, by id.
    pub shards: Vec<ShardDescription>,
    /// The open metadata correction round, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction: Option<CorrectionDescription>,
}

/// One member in a [`GroupDescription`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberDescription {
    /// The member.
    pub member_id: MemberId,
    /// Its current epoch.
    pub epoch: MemberEpoch,
    /// Its instance id.
    pub instance_id: String,
    /// Its incarnation (0 for a member recorded before incarnations existed).
    pub incarnation: Incarnation,
    /// Redis time (ms) its lease ends.
    pub lease_until_ms: u64,
    /// Whether it is fenced (no renewals; removed when its lease ends).
    pub fenced: bool,
    /// Shards it may read.
    pub assigned: Vec<ShardId>,
    /// Shards targeted to it but still held by a previous owner.
    pub pending: Vec<ShardId>,
    /// Shards it must drain.
    pub revoke: Vec<ShardId>,
}

/// One shard in a [`GroupDescription`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShardDescription {
    /// The shard.
    pub shard: ShardId,
    /// The member the assignor wants to own it.
    pub target: Option<MemberId>,
    /// The member that owns it now (may be reading or draining it).
    pub owner: Option<MemberId>,
    /// The shard's fencing token (0 before its first owner).
    #[serde(default)]
    pub fencing_token: FencingToken,
}

/// An open metadata correction round in a [`GroupDescription`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CorrectionDescription {
    /// Redis time (ms) the round started.
    pub started_at_ms: u64,
    /// Highest version a client reported.
    pub reported_max_version: MetadataVersion,
    /// Members that heartbeated with the stored version since the round started.
    pub synced: Vec<MemberId>,
    /// Members still expected to synchronise.
    pub unsynced: Vec<MemberId>,
}

/// `GET /v1/groups`: the groups index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupList {
    /// Known groups, sorted.
    pub groups: Vec<GroupRef>,
}

/// A (stream, group) pair.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupRef {
    /// The stream.
    pub stream: StreamName,
    /// The group.
    pub group: GroupName,
}

/// `GET /v1/quota`: the quotas of the token that asks, and how much of each it uses (see [`docs/operations.md`],
/// "Quotas").
///
/// [`docs/operations.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/operations.md
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaDescription {
    /// The token's name from the token table (never the token itself).
    pub token: String,
    /// Groups on the streams the token's prefixes reach, counted from the groups index in Redis.
    pub groups: QuotaUsage,
    /// Shards of a group's stream: `used` is the largest shard count among those groups' streams.
    pub shards_per_group: QuotaUsage,
    /// Members of one group: `used` is the largest number of members with a lease among those groups.
    pub members_per_group: QuotaUsage,
    /// Requests per second the token may send to one coordinator replica (each replica has its own bucket).
    pub requests_per_second: u32,
    /// Requests the token may send at once after being idle (the bucket's size).
    pub request_burst: u32,
    /// Requests left in the token's bucket on the replica that answered, this request already taken.
    pub requests_available: u32,
}

/// One quota in a [`QuotaDescription`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaUsage {
    /// The limit.
    pub limit: u32,
    /// What the token uses now.
    pub used: u32,
}
