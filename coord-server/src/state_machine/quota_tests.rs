//! The member quota ([`super::quota`]) as the coordinator applies it: inside a batch of heartbeats, against the
//! state the previous requests left.

use proptest::prelude::*;
use protocol::messages::HeartbeatRequest;
use protocol::{MemberEpoch, MetadataVersion, Status};

use super::harness::*;
use super::transition::{Outcome, Transition};
use super::{apply_heartbeats_within, Admission};

fn join(name: &str) -> HeartbeatRequest {
    req(name, 0, MetadataVersion(0), &[], &[])
}

/// Applies `reqs` as one batch, each with the quota `max`, and records the transition.
fn batch(h: &mut Harness, reqs: &[HeartbeatRequest], max: u32) -> (Transition, Vec<Outcome>) {
    let admitted: Vec<Admission<'_>> = reqs
        .iter()
        .map(|req| Admission {
            req,
            max_members: Some(max),
        })
        .collect();
    let (t, outcomes) = apply_heartbeats_within(&h.meta, &h.liveness, &admitted, h.clock());
    h.record(&t);
    (t, outcomes)
}

fn status(outcome: &Outcome) -> Status {
    match outcome {
        Outcome::Heartbeat(r) => r.status,
        Outcome::Rejected(r) => r.status,
        Outcome::Done => panic!("a heartbeat always gets an answer"),
    }
}

#[test]
fn a_join_past_the_member_quota_is_refused_and_writes_nothing() {
    let mut h = Harness::new(4);
    h.join("a");
    h.join("b");
    let before = (h.meta.clone(), h.liveness.clone());
    let (t, outcomes) = batch(&mut h, &[join("c")], 2);
    assert_eq!(status(&outcomes[0]), Status::QuotaExceeded);
    let Outcome::Rejected(r) = &outcomes[0] else {
        unreachable!()
    };
    assert!(r.message.contains("(2)") && r.message.contains('c'), "{}", r.message);
    assert!(t.next.is_none() && t.renew.is_empty() && t.forget.is_empty(), "{t:?}");
    assert_eq!((h.meta, h.liveness), before, "nothing recorded");
}

#[test]
fn under_the_quota_a_join_is_applied() {
    let mut h = Harness::new(4);
    h.join("a");
    let (t, outcomes) = batch(&mut h, &[join("b")], 2);
    assert_eq!(status(&outcomes[0]), Status::Ok);
    assert!(t.next.is_some());
    assert_eq!(h.meta.members.len(), 2);
}

#[test]
fn a_recorded_member_rejoins_and_heartbeats_at_the_limit() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    h.join("b");
    let (_, outcomes) = batch(&mut h, &[follow_up(&a, &[]), join("b")], 2);
    assert_eq!(
        outcomes.iter().map(status).collect::<Vec<_>>(),
        [Status::Ok, Status::Ok],
        "neither adds a member"
    );
    // A quota lowered below what a group holds refuses new members only.
    let (_, outcomes) = batch(&mut h, &[join("a"), join("z")], 1);
    assert_eq!(status(&outcomes[0]), Status::Ok);
    assert_eq!(status(&outcomes[1]), Status::QuotaExceeded);
}

#[test]
fn one_batch_of_joins_never_overshoots() {
    let mut h = Harness::new(8);
    h.join("a");
    let joins = [join("b"), join("c"), join("d")];
    let (_, outcomes) = batch(&mut h, &joins, 2);
    assert_eq!(
        outcomes.iter().map(status).collect::<Vec<_>>(),
        [Status::Ok, Status::QuotaExceeded, Status::QuotaExceeded]
    );
    assert_eq!(h.meta.members.len(), 2);
}

#[test]
fn a_leave_makes_room_for_the_next_join() {
    let mut h = Harness::new(4);
    h.join("a");
    let b = h.join("b");
    let mut leave = follow_up(&b, &[]);
    leave.member_epoch = MemberEpoch::LEAVE;
    let (_, outcomes) = batch(&mut h, &[join("c"), leave, join("c")], 2);
    assert_eq!(
        outcomes.iter().map(status).collect::<Vec<_>>(),
        [Status::QuotaExceeded, Status::Ok, Status::Ok]
    );
    assert!(h.meta.members.contains_key(&member("c")));
}

proptest! {
    /// Whatever the order of joins (of known and new ids) and the quota, a group that starts within its quota
    /// never holds more members than it allows, and a refused join never writes.
    #[test]
    fn members_never_exceed_the_quota(max in 1u32..5, names in proptest::collection::vec(0u8..8, 1..24),
        per_batch in 1usize..4) {
        let mut h = Harness::new(8);
        let reqs: Vec<HeartbeatRequest> = names.iter().map(|n| join(&format!("m{n}"))).collect();
        for chunk in reqs.chunks(per_batch) {
            let before = h.meta.members.len();
            let (t, outcomes) = batch(&mut h, chunk, max);
            let refused = outcomes.iter().filter(|o| status(o) == Status::QuotaExceeded).count();
            prop_assert!(h.meta.members.len() <= max as usize, "{} > {max}", h.meta.members.len());
            if refused == chunk.len() {
                prop_assert!(t.next.is_none() && t.renew.is_empty());
                prop_assert_eq!(h.meta.members.len(), before);
            }
            h.advance(1);
        }
    }
}
