//! `MAX_HEARTBEAT_REQUEST_BYTES` holds the largest valid heartbeat request, written compactly (as the SDKs do) or
//! with a space after every `:` and `,`.

use protocol::messages::{
    HeartbeatRequest, RevokeState, RevokingShard, MAX_HEARTBEAT_REQUEST_BYTES, MAX_INSTANCE_ID_LEN,
};
use protocol::metadata::MAX_SHARDS;
use protocol::names::{MemberId, MAX_NAME_LEN};
use protocol::{Incarnation, MemberEpoch, MetadataVersion, RoutingVersion, ShardId};

fn largest() -> HeartbeatRequest {
    let max = MetadataVersion::MAX_SAFE;
    HeartbeatRequest {
        member_id: MemberId::new("m".repeat(MAX_NAME_LEN)).expect("longest member id"),
        // `"` is escaped: the longest instance id on the wire.
        instance_id: "\"".repeat(MAX_INSTANCE_ID_LEN),
        incarnation: Incarnation(max.0),
        member_epoch: MemberEpoch(i64::MAX),
        metadata_version: max,
        max_observed_version: max,
        owned: Vec::new(),
        revoking: (0..MAX_SHARDS)
            .map(|s| RevokingShard {
                shard: ShardId(s),
                state: RevokeState::Draining,
            })
            .collect(),
        max_routing_version: RoutingVersion(max.0),
        max_shard_count: MAX_SHARDS,
    }
}

#[test]
fn the_largest_valid_heartbeat_fits_the_bound_compact_or_spaced() {
    let compact = serde_json::to_string(&largest()).expect("serialises");
    let spaced = compact.replace(':', ": ").replace(',', ", ");
    assert!(compact.len() <= MAX_HEARTBEAT_REQUEST_BYTES, "{}", compact.len());
    assert!(spaced.len() <= MAX_HEARTBEAT_REQUEST_BYTES, "{}", spaced.len());
    // Not a bound picked far above the need: within 10 % of the spaced form.
    assert!(
        MAX_HEARTBEAT_REQUEST_BYTES <= spaced.len() * 11 / 10,
        "{}",
        spaced.len()
    );
    // Owning every shard instead is shorter.
    let mut owning = largest();
    owning.owned = owning.revoking.drain(..).map(|r| r.shard).collect();
    assert!(serde_json::to_string(&owning).expect("serialises").len() < compact.len());
}
