//! One test per transition of the core, with explicit times (in the style of Kafka's
//! `CurrentAssignmentBuilderTest`).

use protocol::messages::{RevokeState, RevokingShard};
use protocol::metadata::StreamRouting;
use protocol::names::StreamName;
use protocol::{MemberEpoch, MetadataVersion, RoutingVersion, ShardId, Status};

use super::harness::*;
use super::{Event, Input};

fn ids(v: &[ShardId]) -> Vec<u32> {
    v.iter().map(|s| s.0).collect()
}

#[test]
fn first_member_gets_every_shard_at_once() {
    let mut h = Harness::new(4);
    let r = h.join("a");
    assert_eq!(r.status, Status::Ok);
    assert_eq!(ids(&r.assigned), vec![0, 1, 2, 3]);
    assert!(r.pending.is_empty() && r.revoke.is_empty());
    assert_eq!(
        r.member_epoch,
        MemberEpoch(2),
        "join bumps the assignment epoch and adopts it"
    );
    assert_eq!(r.metadata_version, MetadataVersion(2));
    assert_eq!(r.assignment_lease_ms, LEASE);
    assert_eq!(h.liveness[&member("a")], h.now + TTL, "join renews the lease");
}

#[test]
fn second_member_gets_pending_shards_and_first_gets_drain() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    let b = h.join("b");
    assert_eq!(b.status, Status::Ok);
    assert!(b.assigned.is_empty(), "nothing is free yet");
    assert_eq!(ids(&b.pending), vec![2, 3]);
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    assert_eq!(ids(&a2.assigned), vec![0, 1]);
    assert_eq!(ids(&a2.revoke), vec![2, 3], "the DRAIN instruction");
    assert_eq!(
        a2.member_epoch, a.member_epoch,
        "epoch does not move while shards are to be drained"
    );
    assert_eq!(h.owner(2), Some("a"));
    assert_eq!(h.target(2), Some("b"));
}

#[test]
fn drain_answer_is_repeatable_and_writes_nothing_new() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    h.join("b");
    let hb = follow_up(&a, &[]);
    let first = h.send(&hb).unwrap();
    let writes = h.writes;
    let second = h.send(&hb).unwrap();
    assert_eq!(first, second, "a lost DRAIN answer is repaired by the retry");
    assert_eq!(h.writes, writes, "a no-change heartbeat does not rewrite the aggregate");
}

#[test]
fn no_change_heartbeat_renews_liveness_only() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    h.advance(INTERVAL);
    let t = h.apply(Input::Heartbeat(&follow_up(&a, &[])));
    assert!(t.next.is_none());
    assert_eq!(t.renew, vec![(member("a"), h.now + TTL)]);
}

#[test]
fn revoked_ack_releases_and_new_owner_gets_it_on_its_next_heartbeat() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    let b = h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    let a3 = h.send(&follow_up(&a2, &[2, 3])).unwrap();
    assert!(a3.revoke.is_empty());
    assert_eq!(h.owner(2), Some("b"));
    // The answer to the ack is lost; b's next heartbeat still gets the shards.
    let b2 = h.send(&follow_up(&b, &[])).unwrap();
    assert_eq!(ids(&b2.assigned), vec![2, 3]);
    assert!(b2.pending.is_empty());
    assert!(b2.member_epoch >= b.member_epoch);
}

#[test]
fn duplicate_and_stale_acks_change_nothing() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    h.send(&follow_up(&a2, &[2, 3])).unwrap();
    let version = h.meta.metadata_version;
    // Same ack again (lost answer) and an ack for a shard a still reads as target: no change.
    let t = h.apply(Input::Heartbeat(&follow_up(&a2, &[2, 3])));
    assert!(t.next.is_none(), "duplicate REVOKED is ignored");
    let mut stale = follow_up(&a2, &[0]);
    stale.owned.retain(|s| s.0 != 0);
    let t = h.apply(Input::Heartbeat(&stale));
    assert!(
        t.next.is_none(),
        "an ack for a shard still targeted to its owner is ignored"
    );
    assert!(t.events.contains(&Event::StaleAckIgnored {
        shard: ShardId(0),
        member: member("a")
    }));
    assert_eq!(h.meta.metadata_version, version);
    assert_eq!(h.owner(0), Some("a"));
}

#[test]
fn stale_epoch_is_fenced_and_previous_epoch_is_accepted_after_a_lost_answer() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    // a acks; the answer (with the new epoch) is lost.
    let a3 = h.send(&follow_up(&a2, &[2, 3])).unwrap();
    assert!(
        a3.member_epoch > a2.member_epoch,
        "epoch advances once nothing is left to drain"
    );
    // Retry with the previous epoch, owning a subset of what is assigned: accepted.
    let mut retry = follow_up(&a2, &[]);
    retry.owned = shards(&[0, 1]);
    assert_eq!(h.send(&retry).unwrap(), h.send(&follow_up(&a3, &[])).unwrap());
    // Previous epoch but owning a shard no longer assigned: fenced.
    retry.owned = shards(&[0, 1, 2]);
    let err = h.send(&retry).unwrap_err();
    assert_eq!(err.status, Status::FencedMemberEpoch);
    assert_eq!(err.member_epoch, Some(a3.member_epoch));
    // An epoch older than the previous one: fenced.
    let mut old = follow_up(&a3, &[]);
    old.member_epoch = MemberEpoch(1);
    assert_eq!(h.send(&old).unwrap_err().status, Status::FencedMemberEpoch);
}

#[test]
fn unknown_member_is_told_so_and_nothing_is_written() {
    let mut h = Harness::new(2);
    let t = h.apply(Input::Heartbeat(&req("ghost", 5, MetadataVersion(1), &[], &[])));
    assert!(matches!(t.outcome, super::Outcome::Rejected(ref r) if r.status == Status::UnknownMember));
    assert!(!t.writes());
}

#[test]
fn invalid_requests_are_refused_without_writes() {
    let mut h = Harness::new(2);
    let mut r = req("a", 0, MetadataVersion(0), &[], &[]);
    r.instance_id = String::new();
    let t = h.apply(Input::Heartbeat(&r));
    assert!(matches!(t.outcome, super::Outcome::Rejected(ref r) if r.status == Status::InvalidRequest));
    assert!(!t.writes());
    let mut r = req("a", -2, MetadataVersion(0), &[], &[]);
    r.instance_id = "x".into();
    assert_eq!(h.send(&r).unwrap_err().status, Status::InvalidRequest);
    let r = req("a", 0, MetadataVersion(0), &[70_000], &[]);
    assert_eq!(h.send(&r).unwrap_err().status, Status::InvalidRequest);
}

#[test]
fn join_retry_from_the_same_instance_is_idempotent() {
    let mut h = Harness::new(2);
    let first = h.join("a");
    let writes = h.writes;
    let again = h.join("a");
    assert_eq!(first, again);
    assert_eq!(h.writes, writes);
}

#[test]
fn expired_member_loses_its_shards_only_after_its_lease() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    let b = h.join("b");
    h.send(&follow_up(&a, &[])).unwrap();
    // a goes silent while draining 2 and 3.
    h.advance(TTL - 1);
    h.send(&follow_up(&b, &[])).unwrap();
    h.tick();
    assert_eq!(h.owner(2), Some("a"), "not before the lease ends");
    h.advance(1);
    let t = h.tick();
    assert!(t.events.contains(&Event::MemberExpired(member("a"))));
    assert_eq!(t.forget, vec![member("a")]);
    let b2 = h.send(&follow_up(&b, &[])).unwrap();
    assert_eq!(ids(&b2.assigned), vec![0, 1, 2, 3]);
}

#[test]
fn grace_period_expires_nobody() {
    let mut h = Harness::new(2);
    h.join("a");
    h.advance(TTL + 5);
    h.grace_until = h.now + TTL;
    h.tick();
    assert!(h.meta.members.contains_key(&member("a")), "no expiry during grace");
    h.advance(TTL);
    h.tick();
    assert!(!h.meta.members.contains_key(&member("a")));
}

#[test]
fn rebalance_timeout_fences_and_shards_move_when_the_granted_lease_ends() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    let b = h.join("b");
    let mut a2 = h.send(&follow_up(&a, &[])).unwrap();
    // a keeps heartbeating but never reports REVOKED.
    let mut at = 0;
    while at < REBALANCE {
        h.advance(INTERVAL);
        at += INTERVAL;
        a2 = h.send(&follow_up(&a2, &[])).unwrap();
        h.send(&follow_up(&b, &[])).unwrap();
        h.tick();
    }
    assert!(
        h.meta.members[&member("a")].fenced_at_ms.is_some(),
        "fenced at the rebalance timeout"
    );
    let lease_end = h.meta.members[&member("a")].lease_until_ms;
    let err = h.send(&follow_up(&a2, &[])).unwrap_err();
    assert_eq!(err.status, Status::FencedMemberEpoch, "fenced members get no renewal");
    assert_eq!(
        h.liveness[&member("a")],
        lease_end,
        "the fenced heartbeat renewed nothing"
    );
    assert_eq!(h.owner(2), Some("a"));
    assert_eq!(h.target(0), Some("b"), "a is no longer a target");
    h.now = lease_end - 1;
    h.send(&follow_up(&b, &[])).unwrap();
    h.tick();
    assert_eq!(h.owner(2), Some("a"), "not before the last granted lease ends");
    h.now = lease_end;
    h.tick();
    assert_eq!(h.owner(2), Some("b"));
    assert_eq!(h.owner(0), Some("b"));
}

#[test]
fn leave_releases_everything_at_once() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    let b = h.join("b");
    let mut leave = follow_up(&a, &[]);
    leave.member_epoch = MemberEpoch::LEAVE;
    leave.owned.clear();
    let r = h.send(&leave).unwrap();
    assert_eq!(r.member_epoch, MemberEpoch::LEAVE);
    assert!(r.assigned.is_empty());
    let b2 = h.send(&follow_up(&b, &[])).unwrap();
    assert_eq!(ids(&b2.assigned), vec![0, 1, 2, 3]);
    // Leaving twice is harmless.
    assert!(h.send(&leave).is_ok());
}

#[test]
fn leave_from_another_instance_is_refused() {
    let mut h = Harness::new(2);
    h.join("a");
    let mut leave = req("a", -1, MetadataVersion(0), &[], &[]);
    leave.instance_id = "impostor".into();
    assert_eq!(h.send(&leave).unwrap_err().status, Status::UnknownMember);
    assert!(h.meta.members.contains_key(&member("a")));
}

#[test]
fn a_new_incarnation_waits_for_its_predecessors_lease() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    assert_eq!(ids(&a.assigned), vec![0, 1]);
    h.advance(INTERVAL);
    h.send(&follow_up(&a, &[])).unwrap();
    let old_lease = h.liveness[&member("a")];
    // Another process with the same member id joins.
    let mut other = req("a", 0, MetadataVersion(0), &[], &[]);
    other.instance_id = "second-process".into();
    let r = h.send(&other).unwrap();
    assert!(r.member_epoch > a.member_epoch);
    assert!(r.assigned.is_empty(), "the predecessor may still be reading");
    assert_eq!(ids(&r.pending), vec![0, 1]);
    // The old process was replaced: its requests change nothing, and it is told to stop.
    assert_eq!(h.send(&follow_up(&a, &[])).unwrap_err().status, Status::MemberReplaced);
    // Acks for held shards do nothing.
    h.now = old_lease - 1;
    let mut ack = other.clone();
    ack.incarnation = r.incarnation;
    ack.member_epoch = r.member_epoch;
    ack.revoking = vec![RevokingShard {
        shard: ShardId(0),
        state: RevokeState::Revoked,
    }];
    h.send(&ack).unwrap();
    assert_eq!(h.owner(0), Some("a"));
    h.now = old_lease;
    h.tick();
    ack.revoking.clear();
    let r2 = h.send(&ack).unwrap();
    assert_eq!(ids(&r2.assigned), vec![0, 1]);
}

#[test]
fn fenced_member_rejoins_as_a_new_incarnation_with_a_hold() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let t = h.apply(Input::FenceMember(&member("a")));
    assert!(t.events.iter().any(|e| matches!(e, Event::MemberFenced { .. })));
    assert_eq!(
        h.send(&follow_up(&a, &[])).unwrap_err().status,
        Status::FencedMemberEpoch
    );
    let r = h.join("a");
    assert!(r.member_epoch > a.member_epoch);
    assert!(
        r.assigned.is_empty() && r.pending.len() == 2,
        "held until the fenced lease ends"
    );
}

#[test]
fn tick_adopts_a_larger_routing_and_assigns_new_shards() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let mut routing = StreamRouting::new(StreamName::new("s").unwrap(), 4, 1_000);
    routing.routing_version = RoutingVersion(2);
    let t = h.apply(Input::Tick {
        routing: Some(&routing),
    });
    assert!(t.events.contains(&Event::RoutingAdopted {
        version: RoutingVersion(2),
        shard_count: 4
    }));
    let r = h.send(&follow_up(&a, &[])).unwrap();
    assert_eq!(r.shard_count, 4);
    // No growth record: the new shards wait for their parents (the coordinator seals them itself).
    assert_eq!(ids(&r.assigned), vec![0, 1]);
    assert_eq!(ids(&r.pending), vec![2, 3]);
    let observed: Vec<_> = [0, 1]
        .map(|p| super::reshard::Seal {
            routing_version: RoutingVersion(2),
            shard: ShardId(p),
            position: protocol::reshard::EntryId::ZERO,
        })
        .into_iter()
        .flat_map(|s| {
            [
                super::reshard::Observation::Sealed(s),
                super::reshard::Observation::Drained {
                    routing_version: s.routing_version,
                    shard: s.shard,
                    seal: s.position,
                },
            ]
        })
        .collect();
    h.apply(Input::Reshard(&observed));
    let r = h.send(&follow_up(&a, &[])).unwrap();
    assert_eq!(ids(&r.assigned), vec![0, 1, 2, 3]);
    // A routing with fewer shards is refused (shards are only added).
    let mut smaller = routing.clone();
    smaller.shard_count = 3;
    smaller.routing_version = RoutingVersion(3);
    let t = h.apply(Input::Tick {
        routing: Some(&smaller),
    });
    assert!(t.events.contains(&Event::RoutingRefused {
        version: RoutingVersion(3)
    }));
    assert_eq!(h.meta.shard_count, 4);
}

#[test]
fn tick_adopts_a_recreated_routing_with_a_lower_version() {
    let mut h = Harness::new(2);
    h.join("a");
    let mut high = StreamRouting::new(StreamName::new("s").unwrap(), 2, 1_000);
    high.routing_version = RoutingVersion(7);
    h.apply(Input::Tick { routing: Some(&high) });
    // The routing hash is lost and recreated with more shards at version 1: the group must read them all.
    let recreated = StreamRouting::new(StreamName::new("s").unwrap(), 3, 2_000);
    let t = h.apply(Input::Tick {
        routing: Some(&recreated),
    });
    assert!(t.events.contains(&Event::RoutingAdopted {
        version: RoutingVersion(1),
        shard_count: 3
    }));
    assert_eq!(h.meta.shard_count, 3);
}

#[test]
fn a_leave_reporting_a_higher_version_opens_a_round() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    h.join("b");
    let mut leave = follow_up(&a, &[]);
    leave.member_epoch = MemberEpoch::LEAVE;
    leave.owned.clear();
    leave.max_observed_version = MetadataVersion(50);
    h.send(&leave).unwrap();
    assert!(
        h.meta.correction.is_some(),
        "others may hold leases from the lost history too"
    );
    assert!(!h.meta.members.contains_key(&member("a")));
}

#[test]
fn suspected_loss_opens_a_round_on_admin_fence_too() {
    let mut h = Harness::new(2);
    h.join("a");
    h.suspected = Some(MetadataVersion(9));
    h.apply(Input::FenceMember(&member("a")));
    assert_eq!(
        h.meta.correction.as_ref().map(|r| r.reported_max_version),
        Some(MetadataVersion(9))
    );
}

#[test]
fn a_batch_of_heartbeats_records_what_one_by_one_would() {
    let mut h = Harness::new(6);
    let a = h.join("a");
    let b = h.join("b");
    let reqs = [
        follow_up(&a, &[]),
        req("c", 0, MetadataVersion(0), &[], &[]),
        follow_up(&b, &[]),
        follow_up(&a, &[3, 4, 5]),
        req("d", 0, MetadataVersion(0), &[], &[]),
    ];
    let mut one_by_one = h.clone();
    let expected: Vec<_> = reqs
        .iter()
        .map(|r| one_by_one.apply(Input::Heartbeat(r)).outcome)
        .collect();
    let refs: Vec<&protocol::messages::HeartbeatRequest> = reqs.iter().collect();
    let (t, outcomes) = super::apply_heartbeats(&h.meta, &h.liveness, &refs, h.clock());
    assert_eq!(outcomes, expected, "same answers");
    h.record(&t);
    assert_eq!(h.meta, one_by_one.meta, "same recorded metadata");
    assert_eq!(h.liveness, one_by_one.liveness, "same leases");
}

#[test]
fn quiet_tick_writes_nothing() {
    let mut h = Harness::new(2);
    h.join("a");
    h.advance(INTERVAL);
    assert!(!h.tick().writes());
}

mod correction {
    use super::*;

    /// a and b share 4 shards at version v; then Redis loses the last write (a's ack): returns (h, a, b, lost version).
    fn rolled_back() -> (
        Harness,
        protocol::messages::HeartbeatResponse,
        protocol::messages::HeartbeatResponse,
    ) {
        let mut h = Harness::new(4);
        let a = h.join("a");
        let b = h.join("b");
        let a2 = h.send(&follow_up(&a, &[])).unwrap();
        let before = h.clone();
        let a3 = h.send(&follow_up(&a2, &[2, 3])).unwrap();
        let b2 = h.send(&follow_up(&b, &[])).unwrap();
        assert_eq!(ids(&b2.assigned), vec![2, 3], "b reads 2 and 3 in the lost history");
        // Redis falls back to the state before a's ack.
        let now = h.now;
        h = before;
        h.now = now;
        (h, a3, b2)
    }

    #[test]
    fn higher_reported_version_gets_sync_metadata_for_the_stored_version() {
        let (mut h, _a3, b2) = rolled_back();
        let stored = h.meta.metadata_version;
        let hb = follow_up(&b2, &[]);
        assert!(hb.metadata_version > stored);
        let r = h.send(&hb).unwrap();
        assert_eq!(r.status, Status::SyncMetadata);
        assert_eq!(
            r.metadata_version, stored,
            "SYNC_METADATA carries the version Redis has"
        );
        assert!(r.assigned.is_empty(), "2 and 3 are not b's in Redis");
        assert_eq!(ids(&r.pending), vec![2, 3]);
        assert_eq!(
            h.meta.metadata_version, stored,
            "the version is not bumped to match the client"
        );
        assert!(h.meta.correction.is_some());
        // The SYNC answer is lost: the same high-version heartbeat gets the same answer.
        assert_eq!(h.send(&hb).unwrap(), r);
    }

    #[test]
    fn round_goes_sync_then_revoke_pending_then_ok() {
        let (mut h, a3, b2) = rolled_back();
        let sync_b = h.send(&follow_up(&b2, &[])).unwrap();
        assert_eq!(sync_b.status, Status::SyncMetadata);
        // b applied SYNC: it stopped 2 and 3 (not assigned), drains them, reports REVOKED with the stored version.
        let mut b_next = follow_up(&sync_b, &[2, 3]);
        b_next.max_observed_version = b2.metadata_version;
        let rp = h.send(&b_next).unwrap();
        assert_eq!(rp.status, Status::RevokePending, "a is not synced yet");
        // a saw the lost version too: SYNC, then it heartbeats with the stored version.
        let sync_a = h.send(&follow_up(&a3, &[])).unwrap();
        assert_eq!(sync_a.status, Status::SyncMetadata);
        assert_eq!(
            ids(&sync_a.revoke),
            vec![2, 3],
            "Redis still records a as draining 2 and 3"
        );
        let mut a_next = follow_up(&sync_a, &[2, 3]);
        a_next.max_observed_version = a3.metadata_version;
        let rp = h.send(&a_next).unwrap();
        assert_eq!(rp.status, Status::RevokePending, "one member TTL has not passed");
        assert_eq!(
            h.owner(2),
            Some("b"),
            "a's ack is accepted (it matches Redis ownership)"
        );
        h.advance(TTL);
        let mut b_after = follow_up(&rp, &[]);
        b_after.member_id = member("b");
        b_after.instance_id = "b-i".into();
        b_after.incarnation = sync_b.incarnation;
        b_after.member_epoch = sync_b.member_epoch;
        b_after.metadata_version = rp.metadata_version;
        b_after.max_observed_version = b2.metadata_version;
        b_after.owned.clear();
        let ok = h.send(&b_after).unwrap();
        assert_eq!(ok.status, Status::Ok);
        assert_eq!(ids(&ok.assigned), vec![2, 3]);
        assert!(
            ok.metadata_version > b2.metadata_version,
            "the lost version numbers are retired, never reused"
        );
        assert!(h.meta.correction.is_none());
    }

    #[test]
    fn concurrent_stale_revokes_apply_only_where_they_match_redis() {
        let (mut h, a3, b2) = rolled_back();
        // b (lost history owner of 2, 3) reports REVOKED for 0 (a's shard) and owns 2, 3; a reports REVOKED for 2.
        let mut b_hb = follow_up(&b2, &[0]);
        b_hb.owned = shards(&[2, 3]);
        let r = h.send(&b_hb).unwrap();
        assert_eq!(r.status, Status::SyncMetadata);
        assert_eq!(h.owner(0), Some("a"), "b's ack for a's shard is ignored");
        let round = h.meta.correction.as_ref().unwrap();
        assert!(
            round.claims.contains_key(&ShardId(2)),
            "b claims 2 although Redis records a"
        );
        let mut a_hb = follow_up(&a3, &[2]);
        a_hb.owned = shards(&[0, 1]);
        h.send(&a_hb).unwrap();
        assert_eq!(
            h.owner(2),
            Some("b"),
            "a's ack for 2 matches Redis (a owns it, b is target) and is applied"
        );
        assert_eq!(h.owner(3), Some("a"));
        // b must not get OK for 2 while it still claims it from the lost history and a is unsynced.
        h.advance(TTL);
        let r = h.send(&b_hb).unwrap();
        assert_ne!(r.status, Status::Ok);
    }

    #[test]
    fn reading_a_shard_redis_gives_to_someone_else_opens_a_round() {
        let mut h = Harness::new(2);
        let a = h.join("a");
        h.join("b");
        let a2 = h.send(&follow_up(&a, &[])).unwrap();
        let a3 = h.send(&follow_up(&a2, &[1])).unwrap();
        // b claims shard 0 (a's) with a version equal to Redis's: a reused version number.
        let mut b = req(
            "b",
            h.meta.members[&member("b")].epoch.0,
            h.meta.metadata_version,
            &[0],
            &[],
        );
        b.max_observed_version = h.meta.metadata_version;
        let t = h.apply(Input::Heartbeat(&b));
        assert!(t.events.contains(&Event::ForeignClaim {
            shard: ShardId(0),
            member: member("b")
        }));
        assert!(h.meta.correction.is_some());
        // a is not handed anything new until the round closes.
        let r = h.send(&follow_up(&a3, &[])).unwrap();
        assert_eq!(r.status, Status::RevokePending);
    }

    #[test]
    fn unknown_member_from_the_lost_history_opens_a_round() {
        let mut h = Harness::new(2);
        h.join("a");
        let mut ghost = req("ghost", 9, MetadataVersion(50), &[0], &[]);
        ghost.max_observed_version = MetadataVersion(50);
        let t = h.apply(Input::Heartbeat(&ghost));
        assert!(matches!(t.outcome, super::super::Outcome::Rejected(ref r) if r.status == Status::UnknownMember));
        assert!(
            h.meta.correction.is_some(),
            "its lease may still run: nobody starts new shards for one TTL"
        );
    }

    #[test]
    fn tick_closes_the_round_once_everyone_synced_and_a_ttl_passed() {
        let mut h = Harness::new(2);
        let a = h.join("a");
        let mut high = follow_up(&a, &[]);
        high.max_observed_version = MetadataVersion(99);
        // Its current version is the stored one: its view is right, it only has to wait for the round.
        let pending = h.send(&high).unwrap();
        assert_eq!(pending.status, Status::RevokePending);
        let mut behind = follow_up(&pending, &[]);
        behind.metadata_version = MetadataVersion(1);
        assert_eq!(
            h.send(&behind).unwrap().status,
            Status::SyncMetadata,
            "another version: sync first"
        );
        h.advance(TTL - 1);
        h.send(&behind).unwrap();
        h.tick();
        assert!(h.meta.correction.is_some());
        h.advance(1);
        let t = h.tick();
        assert!(t.events.contains(&Event::CorrectionClosed));
        assert_eq!(
            h.meta.metadata_version,
            MetadataVersion(100),
            "past the highest reported version"
        );
        let mut after = follow_up(&pending, &[]);
        after.max_observed_version = MetadataVersion(99);
        assert_eq!(
            h.send(&after).unwrap().status,
            Status::Ok,
            "the remembered 99 no longer opens a round"
        );
    }
}
