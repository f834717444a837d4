//! What recreating a lost group writes: a new group that must not hand out shards the lost group's members may
//! still hold, and whose versions are above any version of the lost group.

use protocol::metadata::{CorrectionRound, GroupMetadata};
use protocol::MetadataVersion;

#[cfg(doc)]
use super::create_group;

/// Turns `meta`, a new group's metadata made at Redis time `now_ms` ([`create_group`]), into the metadata of a
/// group recreated after its metadata was lost.
///
/// * Its metadata version is `now_ms`: the lost group counted up from 1 by at most one per write, and never
///   wrote more than once per millisecond since it was created, so this is above any version it had (clients
///   that report a higher one are corrected, see the correction round).
/// * It starts with an open correction round: clients of the lost group may still hold leases, so members are
///   answered `REVOKE_PENDING` (read nothing) until the round closes (one member TTL).
pub fn recreated(mut meta: GroupMetadata, now_ms: u64) -> GroupMetadata {
    meta.metadata_version = MetadataVersion(now_ms);
    meta.correction = Some(CorrectionRound {
        started_at_ms: now_ms,
        reported_max_version: meta.metadata_version,
        synced: Default::default(),
        claims: Default::default(),
    });
    meta
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::create_group;
    use protocol::metadata::{GroupTimings, StreamRouting};
    use protocol::names::{GroupName, StreamName};

    const NOW: u64 = 1_700_000_000_000;

    fn created() -> GroupMetadata {
        let stream = StreamName::new("s").unwrap();
        let routing = StreamRouting::new(stream.clone(), 4, 0);
        create_group(
            stream,
            GroupName::new("g").unwrap(),
            &routing,
            GroupTimings::default(),
            NOW,
        )
    }

    fn recreated() -> GroupMetadata {
        super::recreated(created(), NOW)
    }

    #[test]
    fn the_version_is_the_redis_time() {
        let meta = recreated();
        assert_eq!(meta.metadata_version, MetadataVersion(NOW));
        // A created group starts at 1: the recreated one is above every version a lost group can have reached.
        assert!(created().metadata_version < meta.metadata_version);
        assert_eq!(created().correction, None, "a created group has no round");
    }

    #[test]
    fn a_correction_round_is_open_from_the_start() {
        let meta = recreated();
        let round = meta.correction.expect("an open round");
        assert_eq!(round.started_at_ms, NOW);
        assert_eq!(round.reported_max_version, MetadataVersion(NOW));
        assert!(round.synced.is_empty() && round.claims.is_empty());
    }

    #[test]
    fn members_are_held_while_the_round_is_open() {
        use crate::state_machine::{apply, Clock, Input, Liveness, Outcome};
        use protocol::messages::HeartbeatRequest;
        use protocol::names::MemberId;
        use protocol::MemberEpoch;

        let meta = recreated();
        let join = HeartbeatRequest {
            member_id: MemberId::new("m").unwrap(),
            instance_id: "i".into(),
            incarnation: protocol::Incarnation::NONE,
            member_epoch: MemberEpoch::JOIN,
            metadata_version: MetadataVersion(0),
            max_observed_version: MetadataVersion(0),
            owned: Vec::new(),
            revoking: Vec::new(),
            max_routing_version: protocol::RoutingVersion(0),
            max_shard_count: 0,
        };
        let t = apply(&meta, &Liveness::new(), Input::Heartbeat(&join), Clock::at(NOW + 1));
        let Outcome::Heartbeat(r) = t.outcome else {
            panic!("{:?}", t.outcome)
        };
        // REVOKE_PENDING: the member may not read its assignment until the round closes (one member TTL).
        assert_eq!(r.status, protocol::Status::RevokePending, "{r:?}");
        assert_eq!(r.metadata_version, MetadataVersion(NOW), "the round holds the version");
    }
}
