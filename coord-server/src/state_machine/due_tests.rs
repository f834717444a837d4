//! The due-time claim, proved on states: before [`next_due_ms`] a tick writes nothing, at it the tick writes.
//! One property on freely generated states (any mix of leases, fences, holds, drains, rounds and reshards, most
//! of which no history reaches) and one on states a random history of requests and time reaches; then one test
//! per deadline kind.

use proptest::prelude::*;
use protocol::metadata::{CorrectionRound, GroupMetadata, MemberRecord, ShardRecord};
use protocol::names::MemberId;
use protocol::reshard::GroupReshard;
use protocol::{FencingToken, Incarnation, MemberEpoch, MetadataVersion, RoutingVersion, ShardId};
use std::collections::{BTreeMap, BTreeSet};

use super::super::harness::{follow_up, member, Harness, REBALANCE, TTL};
use super::super::transition::{Clock, Liveness};
use super::super::{apply, Input};
use super::{next_due_ms, visit_due_ms};

/// Whether a tick at `t` (grace until `grace`, no routing, no suspected loss) writes.
fn writes_at(meta: &GroupMetadata, live: &Liveness, grace: u64, t: u64) -> bool {
    let clock = Clock {
        now_ms: t,
        expiry_allowed_from_ms: grace,
        suspected_loss: None,
    };
    apply(meta, live, Input::Tick { routing: None }, clock).writes()
}

/// Checks the claim at every interesting time: each threshold-like value of the state and one below it, and
/// `probes` (random times).
fn check(meta: &GroupMetadata, live: &Liveness, grace: u64, probes: &[u64]) -> Result<(), TestCaseError> {
    let due = next_due_ms(meta, live, grace);
    let mut times: Vec<u64> = probes.to_vec();
    times.push(grace);
    for m in meta.members.values() {
        times.extend([m.lease_until_ms, m.hold_until_ms.unwrap_or(0)]);
        times.extend(m.revoking_since_ms.map(|s| s + meta.timings.rebalance_timeout_ms));
    }
    times.extend(live.values().copied());
    if let Some(r) = &meta.correction {
        times.extend([
            r.started_at_ms + meta.timings.rebalance_timeout_ms,
            r.started_at_ms + meta.timings.member_ttl_ms,
        ]);
    }
    let below: Vec<u64> = times.iter().map(|t| t.saturating_sub(1)).collect();
    times.extend(below);
    for t in times.into_iter().filter(|&t| t < 1 << 40) {
        if due.is_none_or(|d| t < d) {
            prop_assert!(!writes_at(meta, live, grace, t), "tick at {t} writes, due {due:?}");
        }
    }
    if let Some(d) = due {
        prop_assert!(
            writes_at(meta, live, grace, d),
            "due at {d} but the tick writes nothing then"
        );
    }
    Ok(())
}

fn id(i: u8) -> MemberId {
    MemberId::new(format!("m{i}")).unwrap()
}

/// Small times, so thresholds collide often.
fn time() -> impl Strategy<Value = u64> {
    0u64..30_000
}

/// A lease end: often far beyond the other times, so the other deadlines come first.
fn lease() -> impl Strategy<Value = u64> {
    prop_oneof![time(), 60_000u64..90_000]
}

fn member_record() -> impl Strategy<Value = MemberRecord> {
    (
        lease(),
        prop::option::weighted(0.3, time()),
        prop::option::weighted(0.3, time()),
        prop::option::weighted(0.4, time()),
    )
        .prop_map(|(lease, fenced, hold, revoking)| MemberRecord {
            instance_id: "i".into(),
            incarnation: Incarnation(1),
            joined_after: Incarnation::NONE,
            epoch: MemberEpoch(1),
            previous_epoch: None,
            joined_at_ms: 0,
            lease_until_ms: lease,
            fenced_at_ms: fenced,
            hold_until_ms: hold,
            revoking_since_ms: revoking,
        })
}

/// A member id from a pool one larger than the members, so shards may name someone not in the group.
fn maybe_id() -> impl Strategy<Value = Option<MemberId>> {
    prop::option::weighted(0.7, (0u8..4).prop_map(id))
}

fn shard_record() -> impl Strategy<Value = ShardRecord> {
    (
        maybe_id(),
        maybe_id(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.9),
    )
        .prop_map(|(target, owner, out_of_step, token)| {
            let draining = owner.is_some() && owner != target;
            ShardRecord {
                // Mostly in step with the table, so the deadlines (not the immediate work) are what is tested.
                revoke_since_version: (draining != out_of_step).then_some(MetadataVersion(3)),
                fencing_token: FencingToken(u64::from(token || owner.is_none())),
                target,
                owner,
            }
        })
}

prop_compose! {
    fn state()(
        members in prop::collection::btree_map((0u8..3).prop_map(id), member_record(), 0..4),
        live in prop::collection::btree_map((0u8..4).prop_map(id), prop_oneof![9 => lease(), 1 => Just(u64::MAX)], 0..4),
        shards in prop::collection::vec(shard_record(), 1..5),
        round in prop::option::weighted(0.4, (time(), prop::collection::btree_set((0u8..4).prop_map(id), 0..4),
            prop::collection::btree_map((0u32..4).prop_map(ShardId), prop::collection::btree_set((0u8..4).prop_map(id), 1..3), 0..2))),
        reshard in prop::option::weighted(0.1, (0u32..3, any::<bool>())),
        rebalance in 1u64..15_000,
        ttl in 1u64..15_000,
    ) -> (GroupMetadata, Liveness) {
        let mut h = Harness::new(shards.len() as u32);
        h.meta.timings.rebalance_timeout_ms = rebalance;
        h.meta.timings.member_ttl_ms = ttl;
        h.meta.members = members;
        h.meta.shards = shards;
        h.meta.correction = round.map(|(started, synced, claims)| CorrectionRound {
            started_at_ms: started,
            reported_max_version: MetadataVersion(9),
            synced,
            claims,
        });
        if let Some((parents, done)) = reshard {
            h.meta.reshards.push(GroupReshard {
                routing_version: RoutingVersion(2),
                parents: parents + 1,
                shard_count: parents + 2,
                seals: BTreeMap::new(),
                drained: if done { (0..=parents).map(ShardId).collect() } else { BTreeSet::new() },
                since_ms: 0,
            });
        }
        (h.meta, live)
    }
}

/// A step of a history on the harness: a member joins, heartbeats (acknowledging every drain), or time passes
/// (with a tick, as the loop would run one at some point).
#[derive(Debug, Clone)]
enum Step {
    Join(u8),
    Heartbeat(u8),
    Advance(u16),
    Tick,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0u8..3).prop_map(Step::Join),
        5 => (0u8..3).prop_map(Step::Heartbeat),
        4 => (1u16..6_000).prop_map(Step::Advance),
        2 => Just(Step::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn no_tick_writes_before_the_due_time_and_one_does_at_it(
        (meta, live) in state(),
        grace in prop::option::weighted(0.3, time()),
        probes in prop::collection::vec(time(), 0..8),
    ) {
        check(&meta, &live, grace.unwrap_or(0), &probes)?;
    }

    #[test]
    fn the_claim_holds_on_every_state_a_history_reaches(steps in prop::collection::vec(step(), 1..40)) {
        let mut h = Harness::new(4);
        let mut last: BTreeMap<u8, protocol::messages::HeartbeatResponse> = BTreeMap::new();
        for s in steps {
            match s {
                Step::Join(m) => {
                    if let Ok(r) = h.send(&super::super::harness::req(&format!("m{m}"), 0, MetadataVersion(0), &[], &[])) {
                        last.insert(m, r);
                    }
                }
                Step::Heartbeat(m) => {
                    if let Some(prev) = last.get(&m) {
                        let revoked: Vec<u32> = prev.revoke.iter().map(|s| s.0).collect();
                        match h.send(&follow_up(prev, &revoked)) {
                            Ok(r) => { last.insert(m, r); }
                            Err(_) => { last.remove(&m); }
                        }
                    }
                }
                Step::Advance(ms) => h.advance(u64::from(ms)),
                Step::Tick => { h.tick(); }
            }
            check(&h.meta, &h.liveness, h.grace_until, &[h.now])?;
        }
    }
}

fn joined(names: &[&str]) -> Harness {
    let mut h = Harness::new(4);
    for n in names {
        h.join(n);
    }
    h.tick();
    h
}

#[test]
fn an_empty_group_is_never_due() {
    let h = Harness::new(4);
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), None);
}

#[test]
fn a_member_is_due_when_its_renewed_lease_ends() {
    let mut h = joined(&["a"]);
    let end = h.liveness[&member("a")];
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(end));
    // A renewal moves it later; the aggregate's older lease end does not count.
    h.liveness.insert(member("a"), end + 5_000);
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(end + 5_000));
    // A section that loaded no liveness for the member answers the aggregate's lease end: earlier, still safe.
    let partial = Liveness::new();
    assert!(next_due_ms(&h.meta, &partial, 0) <= Some(end));
}

#[test]
fn the_expiry_grace_delays_the_due_time() {
    let h = joined(&["a"]);
    let end = h.liveness[&member("a")];
    assert_eq!(next_due_ms(&h.meta, &h.liveness, end + 777), Some(end + 777));
}

#[test]
fn a_fenced_member_is_due_when_the_lease_it_was_granted_ends() {
    let mut h = joined(&["a"]);
    let end = h.liveness[&member("a")];
    h.apply(Input::FenceMember(&member("a")));
    assert!(h.meta.members[&member("a")].fenced_at_ms.is_some());
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(end));
}

#[test]
fn a_draining_member_is_due_at_its_rebalance_timeout() {
    let mut h = joined(&["a"]);
    h.advance(100);
    h.join("b");
    let since = h.meta.members[&member("a")].revoking_since_ms.expect("a drains for b");
    // Leases are renewed far ahead, so the rebalance timeout is the first deadline.
    h.liveness.values_mut().for_each(|l| *l += 100_000);
    h.meta.members.values_mut().for_each(|m| m.lease_until_ms += 100_000);
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(since + REBALANCE));
}

#[test]
fn a_hold_is_due_when_it_ends() {
    let mut h = joined(&["a"]);
    h.liveness.values_mut().for_each(|l| *l += 100_000);
    h.meta.members.values_mut().for_each(|m| m.lease_until_ms += 100_000);
    h.meta.members.get_mut(&member("a")).unwrap().hold_until_ms = Some(h.now + 1_234);
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(h.now + 1_234));
}

#[test]
fn a_correction_round_is_due_at_its_timeout_while_someone_is_unsynced_and_closes_after_a_ttl() {
    let mut h = joined(&["a"]);
    h.liveness.values_mut().for_each(|l| *l += 100_000);
    h.meta.members.values_mut().for_each(|m| m.lease_until_ms += 100_000);
    let started = h.now;
    h.meta.correction = Some(CorrectionRound {
        started_at_ms: started,
        reported_max_version: MetadataVersion(50),
        synced: BTreeSet::new(),
        claims: BTreeMap::new(),
    });
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(started + REBALANCE));
    h.meta.correction.as_mut().unwrap().synced.insert(member("a"));
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(started + TTL));
}

#[test]
fn a_synced_member_still_claiming_a_shard_is_due_at_the_round_timeout_or_when_its_hold_ends() {
    let mut h = joined(&["a"]);
    h.liveness.values_mut().for_each(|l| *l += 100_000);
    h.meta.members.values_mut().for_each(|m| m.lease_until_ms += 100_000);
    let started = h.now;
    h.meta.correction = Some(CorrectionRound {
        started_at_ms: started,
        reported_max_version: MetadataVersion(50),
        synced: [member("a")].into(),
        claims: [(ShardId(0), [member("a")].into())].into(),
    });
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(started + REBALANCE));
    h.meta.members.get_mut(&member("a")).unwrap().hold_until_ms = Some(started + REBALANCE + 700);
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(started + REBALANCE + 700));
}

#[test]
fn unsettled_work_and_open_reshards_are_due_at_once() {
    let mut h = joined(&["a"]);
    h.meta.shards[0].owner = None;
    assert_eq!(next_due_ms(&h.meta, &h.liveness, 0), Some(0));
    let mut h = joined(&["a"]);
    let lease = next_due_ms(&h.meta, &h.liveness, 0);
    assert!(lease > Some(0));
    h.meta.reshards.push(GroupReshard {
        routing_version: RoutingVersion(2),
        parents: 2,
        shard_count: 4,
        seals: BTreeMap::new(),
        drained: BTreeSet::new(),
        since_ms: 0,
    });
    assert_eq!(
        next_due_ms(&h.meta, &h.liveness, 0),
        lease,
        "waiting on Redis, not on time"
    );
    assert_eq!(
        visit_due_ms(&h.meta, &h.liveness, 0),
        Some(0),
        "but the tick observes it"
    );
}
