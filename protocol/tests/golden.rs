//! Golden JSON fixtures: every wire message and stored document, serialized, must equal its file in
//! `testdata/`, and each file must parse back to the same value. Run with `UPDATE_GOLDEN=1` to rewrite the files
//! after a deliberate wire change (and say so in CHANGELOG.md).

use protocol::messages::*;
use protocol::metadata::*;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::routing::shard_for_key;
use protocol::*;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::PathBuf;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)
}

fn golden<T: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, value: &T) {
    let path = testdata(&format!("messages/{name}.json"));
    let json = serde_json::to_string_pretty(value).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &json).unwrap();
    }
    let stored = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with UPDATE_GOLDEN=1 once", path.display()));
    assert_eq!(stored, json, "wire format of {name} changed");
    let back: T = serde_json::from_str(&stored).unwrap();
    assert_eq!(&back, value, "{name} does not round-trip");
}

fn member(s: &str) -> MemberId {
    MemberId::new(s).unwrap()
}

#[test]
fn heartbeat_messages() {
    golden(
        "heartbeat-request",
        &HeartbeatRequest {
            member_id: member("worker-1"),
            instance_id: "7f3a9c".into(),
            incarnation: Incarnation(1_700_000_000_321),
            member_epoch: MemberEpoch(4),
            metadata_version: MetadataVersion(12),
            max_observed_version: MetadataVersion(12),
            owned: vec![ShardId(0), ShardId(2)],
            revoking: vec![
                RevokingShard {
                    shard: ShardId(1),
                    state: RevokeState::Draining,
                },
                RevokingShard {
                    shard: ShardId(3),
                    state: RevokeState::Revoked,
                },
            ],
            max_routing_version: protocol::RoutingVersion(0),
            max_shard_count: 0,
        },
    );
    golden(
        "heartbeat-response",
        &HeartbeatResponse {
            status: Status::Ok,
            member_id: member("worker-1"),
            incarnation: Incarnation(1_700_000_000_321),
            member_epoch: MemberEpoch(5),
            metadata_version: MetadataVersion(13),
            assignment_epoch: AssignmentEpoch(5),
            assigned: vec![ShardId(0), ShardId(2)],
            fencing_tokens: vec![
                ShardToken {
                    shard: ShardId(0),
                    token: FencingToken(1_700_000_000_123),
                },
                ShardToken {
                    shard: ShardId(2),
                    token: FencingToken(1_700_000_004_567),
                },
            ],
            pending: vec![ShardId(4)],
            revoke: vec![ShardId(1)],
            heartbeat_interval_ms: 2000,
            assignment_lease_ms: 8000,
            shard_count: 8,
            routing_version: RoutingVersion(1),
        },
    );
    golden(
        "error-response",
        &ErrorResponse {
            status: Status::FencedMemberEpoch,
            message: "member epoch 3 is stale; the group records 5".into(),
            member_epoch: Some(MemberEpoch(5)),
            retry_after_ms: None,
        },
    );
}

#[test]
fn routing_messages() {
    golden(
        "routing-query",
        &RoutingQuery {
            routing_version: RoutingVersion(2),
            max_observed_version: RoutingVersion(3),
            max_shard_count: 8,
        },
    );
    golden(
        "routing-response",
        &RoutingResponse {
            status: Status::SyncMetadata,
            stream: StreamName::new("orders").unwrap(),
            routing_version: RoutingVersion(2),
            shard_count: 8,
            routing_lease_ms: 30000,
            refresh_interval_ms: 10000,
            shard_records: true,
        },
    );
}

#[test]
fn admin_messages() {
    golden(
        "create-group-request",
        &CreateGroupRequest {
            shard_count: Some(8),
            timings: Some(GroupTimings::default()),
        },
    );
    golden(
        "recreate-group-request",
        &RecreateGroupRequest {
            confirm: true,
            shard_count: 8,
            timings: None,
        },
    );
    golden("add-shards-request", &AddShardsRequest { count: 4 });
    golden(
        "routing-description",
        &RoutingDescription {
            stream: StreamName::new("orders").unwrap(),
            revision: StoreRevision(3),
            routing_version: RoutingVersion(2),
            shard_count: 12,
            routing_lease_ms: 30000,
            shard_records: true,
            shards_beyond_routing: 0,
            fence_above_routing: None,
        },
    );
    golden(
        "group-description",
        &GroupDescription {
            stream: StreamName::new("orders").unwrap(),
            group: GroupName::new("billing").unwrap(),
            revision: StoreRevision(40),
            metadata_version: MetadataVersion(17),
            assignment_epoch: AssignmentEpoch(6),
            routing_version: RoutingVersion(1),
            shard_count: 2,
            timings: GroupTimings::default(),
            members: vec![MemberDescription {
                member_id: member("a"),
                epoch: MemberEpoch(6),
                instance_id: "i-1".into(),
                incarnation: Incarnation(1_700_000_000_007),
                lease_until_ms: 1_700_000_010_000,
                fenced: false,
                assigned: vec![ShardId(0)],
                pending: vec![ShardId(1)],
                revoke: vec![],
            }],
            shards: vec![
                ShardDescription {
                    shard: ShardId(0),
                    target: Some(member("a")),
                    owner: Some(member("a")),
                    fencing_token: FencingToken(1_700_000_000_123),
                },
                ShardDescription {
                    shard: ShardId(1),
                    target: Some(member("a")),
                    owner: Some(member("b")),
                    fencing_token: FencingToken(1_700_000_000_042),
                },
            ],
            correction: Some(CorrectionDescription {
                started_at_ms: 1_700_000_000_000,
                reported_max_version: MetadataVersion(18),
                synced: vec![member("a")],
                unsynced: vec![member("b")],
            }),
        },
    );
    golden(
        "group-list",
        &GroupList {
            groups: vec![GroupRef {
                stream: StreamName::new("orders").unwrap(),
                group: GroupName::new("billing").unwrap(),
            }],
        },
    );
    golden(
        "quota-description",
        &QuotaDescription {
            token: "tenant-a".into(),
            groups: QuotaUsage { limit: 100, used: 12 },
            shards_per_group: QuotaUsage { limit: 1024, used: 64 },
            members_per_group: QuotaUsage { limit: 1024, used: 9 },
            requests_per_second: 1000,
            request_burst: 2000,
            requests_available: 1999,
        },
    );
}

#[test]
fn stored_documents() {
    let mut members = BTreeMap::new();
    members.insert(
        member("a"),
        MemberRecord {
            instance_id: "i-1".into(),
            incarnation: Incarnation(1_000),
            joined_after: Incarnation(900),
            epoch: MemberEpoch(3),
            previous_epoch: Some(MemberEpoch(2)),
            joined_at_ms: 1000,
            lease_until_ms: 11000,
            fenced_at_ms: None,
            hold_until_ms: None,
            revoking_since_ms: Some(1500),
        },
    );
    let meta = GroupMetadata {
        schema_version: GROUP_SCHEMA_VERSION,
        stream: StreamName::new("orders").unwrap(),
        group: GroupName::new("billing").unwrap(),
        metadata_version: MetadataVersion(9),
        assignment_epoch: AssignmentEpoch(3),
        routing_version: RoutingVersion(1),
        shard_count: 2,
        timings: GroupTimings::default(),
        created_at_ms: 1000,
        members,
        shards: vec![
            ShardRecord {
                target: Some(member("a")),
                owner: Some(member("a")),
                fencing_token: FencingToken(1_200),
                ..ShardRecord::default()
            },
            ShardRecord {
                target: None,
                owner: Some(member("a")),
                fencing_token: FencingToken(1_500),
                ..ShardRecord::default()
            },
        ],
        correction: Some(CorrectionRound {
            started_at_ms: 2000,
            reported_max_version: MetadataVersion(10),
            synced: BTreeSet::from([member("a")]),
            claims: BTreeMap::new(),
        }),
        reshards: Vec::new(),
        last_incarnation: Incarnation(1_000),
        reports_settled: false,
    };
    golden("group-metadata", &meta);
    golden(
        "stream-routing",
        &StreamRouting::new(StreamName::new("orders").unwrap(), 8, 1000),
    );
}

/// Rewrites `testdata/routing-vectors.json` under `UPDATE_GOLDEN=1`; the unit tests of `routing` check the file
/// (and the implementation against the published reference values).
#[test]
fn routing_vectors_file_is_current() {
    #[derive(Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Vector {
        key_hex: String,
        shard_count: u32,
        shard: u32,
    }
    let mut keys: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"a".to_vec(),
        b"customer-42".to_vec(),
        "주문-7".as_bytes().to_vec(),
        "ключ".as_bytes().to_vec(),
        "🦀".as_bytes().to_vec(),
        vec![0u8],
        vec![0xff, 0x00, 0x7f, 0x80],
        (0u8..=255).collect(),
    ];
    keys.extend((0..8).map(|i| format!("order-{i}").into_bytes()));
    let mut vectors = Vec::new();
    for key in &keys {
        for count in [1u32, 2, 3, 8, 16, 100, 1024, 65536] {
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            vectors.push(Vector {
                key_hex: hex,
                shard_count: count,
                shard: shard_for_key(key, count).0,
            });
        }
    }
    let path = testdata("routing-vectors.json");
    let json = serde_json::to_string_pretty(&vectors).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &json).unwrap();
    }
    assert_eq!(std::fs::read_to_string(&path).unwrap(), json);
}
