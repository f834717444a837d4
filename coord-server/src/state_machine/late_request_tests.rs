//! Late and duplicated requests: a heartbeat the client gave up on reaches the coordinator after later ones.
//! It may carry nothing but history, so it must neither open a correction round nor get a healthy member fenced.

use protocol::messages::{HeartbeatRequest, HeartbeatResponse, RevokeState, RevokingShard};
use protocol::{MetadataVersion, ShardId, Status};

use super::harness::*;
use super::Event;

/// `last`'s follow-up that reads `reading` and drains `draining`.
fn draining(last: &HeartbeatResponse, reading: &[u32], draining: &[u32]) -> HeartbeatRequest {
    let mut r = follow_up(last, &[]);
    r.owned = shards(reading);
    r.revoking = draining
        .iter()
        .map(|&s| RevokingShard {
            shard: ShardId(s),
            state: RevokeState::Draining,
        })
        .collect();
    r
}

fn fenced(h: &Harness, name: &str) -> bool {
    h.meta.members[&member(name)].fenced_at_ms.is_some()
}

/// a reads 0-3, b joins: a must drain 2 and 3. a sends "draining 2, 3" (the request is delayed), then acks 2
/// while 3 is still draining (its epoch stays). Returns the harness, a's latest answer, b's join and the late request.
fn late_drain_report() -> (Harness, HeartbeatResponse, HeartbeatResponse, HeartbeatRequest) {
    let mut h = Harness::new(4);
    let a = h.join("a");
    let b = h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    assert_eq!(a2.revoke, shards(&[2, 3]));
    let late = draining(&a2, &[0, 1], &[2, 3]);
    let mut ack = draining(&a2, &[0, 1], &[3]);
    ack.revoking.push(RevokingShard {
        shard: ShardId(2),
        state: RevokeState::Revoked,
    });
    let a3 = h.send(&ack).unwrap();
    assert_eq!(h.owner(2), Some("b"), "a's ack released 2 to b");
    assert_eq!(
        a3.member_epoch, late.member_epoch,
        "still draining 3: a's epoch is current"
    );
    assert!(late.metadata_version < h.meta.metadata_version);
    (h, a3, b, late)
}

#[test]
fn a_late_drain_report_opens_no_round() {
    let (mut h, _a3, _b, late) = late_drain_report();
    let t = h.apply(super::Input::Heartbeat(&late));
    assert!(
        !t.events
            .iter()
            .any(|e| matches!(e, Event::CorrectionOpened { .. } | Event::ForeignClaim { .. })),
        "{:?}",
        t.events
    );
    assert!(h.meta.correction.is_none());
}

#[test]
fn after_a_late_drain_report_the_group_settles_and_nobody_is_fenced() {
    let (mut h, a3, b, late) = late_drain_report();
    h.send(&late).unwrap();
    let mut a_last = a3;
    let mut b_last = b;
    let mut b_reading: Vec<u32> = Vec::new();
    for _ in 0..(2 * REBALANCE / INTERVAL) {
        h.advance(INTERVAL);
        let acks: Vec<u32> = a_last.revoke.iter().map(|s| s.0).collect();
        a_last = h.send(&follow_up(&a_last, &acks)).unwrap();
        let mut hb = follow_up(&b_last, &[]);
        hb.owned = shards(&b_reading);
        b_last = h.send(&hb).unwrap();
        if b_last.status == Status::Ok {
            b_reading = b_last.assigned.iter().map(|s| s.0).collect();
        }
        h.tick();
    }
    assert!(!fenced(&h, "a") && !fenced(&h, "b"));
    assert_eq!(b_last.status, Status::Ok);
    assert_eq!(b_reading, vec![2, 3], "b reads its shards");
}

#[test]
fn a_claim_a_late_request_records_inside_a_round_ends_at_the_members_next_heartbeat() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    let b = h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    // A round opens (someone reports a lost version): the stored version is held, so a late request carries it.
    let mut ghost = req("ghost", 3, MetadataVersion(h.meta.metadata_version.0 + 3), &[], &[]);
    ghost.max_observed_version = ghost.metadata_version;
    h.send(&ghost).unwrap_err();
    assert!(h.meta.correction.is_some());
    let late = draining(&a2, &[0, 1], &[2, 3]);
    let a3 = h.send(&follow_up(&a2, &[2, 3])).unwrap();
    assert_eq!(h.owner(2), Some("b"));
    h.send(&late).unwrap();
    assert!(
        h.meta.correction.as_ref().unwrap().claims.contains_key(&ShardId(2)),
        "same version as stored: recorded until a says otherwise"
    );
    let a4 = h.send(&follow_up(&a3, &[])).unwrap();
    assert!(
        h.meta.correction.as_ref().is_none_or(|r| r.claims.is_empty()),
        "a no longer lists 2 or 3: its claims ended"
    );
    let mut a_last = a4;
    let mut b_last = h.send(&follow_up(&b, &[])).unwrap();
    for _ in 0..(2 * REBALANCE / INTERVAL) {
        h.advance(INTERVAL);
        a_last = h.send(&follow_up(&a_last, &[])).unwrap();
        b_last = h.send(&follow_up(&b_last, &[])).unwrap();
        h.tick();
    }
    assert!(!fenced(&h, "a") && !fenced(&h, "b"));
    assert!(h.meta.correction.is_none());
    assert_eq!(b_last.status, Status::Ok);
}

#[test]
fn a_request_from_the_lost_history_at_the_stored_version_still_opens_a_round() {
    // The rule keeps what claims are for: a member that applied the stored version and still reads a shard Redis
    // gives to someone else read it in a lost history whose version number was reused.
    let mut h = Harness::new(2);
    let a = h.join("a");
    h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    let a3 = h.send(&follow_up(&a2, &[1])).unwrap();
    let mut b = req(
        "b",
        h.meta.members[&member("b")].epoch.0,
        h.meta.metadata_version,
        &[0],
        &[],
    );
    b.max_observed_version = h.meta.metadata_version;
    h.send(&b).unwrap();
    assert!(h.meta.correction.is_some());
    assert_eq!(h.send(&follow_up(&a3, &[])).unwrap().status, Status::RevokePending);
}

#[test]
fn a_late_revoked_ack_from_before_the_drain_instruction_releases_nothing() {
    // a's client lease ran out: it stopped 0 and 1 and reports them REVOKED; the coordinator still assigns them
    // to a (acks ignored) and a reads them again. The same request, duplicated, arrives after b joined and 1 was
    // moved to b: it must not free 1, which a is reading until it drains it.
    let mut h = Harness::new(2);
    let a = h.join("a");
    let stopped = follow_up(&a, &[0, 1]);
    let a2 = h.send(&stopped).unwrap();
    assert_eq!(a2.assigned, shards(&[0, 1]), "a reads 0 and 1 again");
    h.join("b");
    let t = h.apply(super::Input::Heartbeat(&stopped));
    assert!(
        !t.events.iter().any(|e| matches!(e, Event::ShardReleased { .. })),
        "{:?}",
        t.events
    );
    assert_eq!(h.owner(1), Some("a"), "1 waits for a's drain");
    let a3 = h.send(&follow_up(&a2, &[])).unwrap();
    assert_eq!(a3.revoke, shards(&[1]));
    h.send(&follow_up(&a3, &[1])).unwrap();
    assert_eq!(h.owner(1), Some("b"), "the ack sent after the instruction releases it");
}
