//! The version bounds (`bounds`): a reported version moves the stored one only as far as a lost history can,
//! nothing the coordinator stores fails its own validation, and no client can hold a round open.

use protocol::metadata::CorrectionRound;
use protocol::{MemberEpoch, MetadataVersion, Status};

use super::bounds::{report_ceiling, REPORT_LIMIT};
use super::harness::*;
use super::{Event, Input, Outcome};

/// A leave from a member Redis does not know, reporting `version`.
fn stranger_leave(version: MetadataVersion) -> protocol::messages::HeartbeatRequest {
    let mut r = req("stranger", -1, version, &[], &[]);
    r.member_epoch = MemberEpoch::LEAVE;
    r
}

#[test]
fn versions_beyond_the_json_safe_range_are_refused_and_change_nothing() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let before = h.meta.clone();
    let mut r = stranger_leave(MetadataVersion(1 << 53));
    let t = h.apply(Input::Heartbeat(&r));
    assert!(matches!(t.outcome, Outcome::Rejected(ref r) if r.status == Status::InvalidRequest));
    assert!(!t.writes());
    r.max_observed_version = MetadataVersion::MAX_SAFE;
    r.metadata_version = MetadataVersion(0);
    assert!(h.send(&r).is_ok(), "2^53 - 1 is on the wire");
    assert_eq!(h.meta, before, "but no lost history reaches it: ignored");
    assert_eq!(h.send(&follow_up(&a, &[])).unwrap().status, Status::Ok);
}

#[test]
fn a_report_above_the_ceiling_is_ignored_and_one_at_it_opens_a_round() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let ceiling = report_ceiling(h.meta.metadata_version, h.now);
    let above = MetadataVersion(ceiling.0 + 1);
    let t = h.apply(Input::Heartbeat(&stranger_leave(above)));
    assert!(t.events.contains(&Event::ImplausibleVersionIgnored {
        reported: above,
        ceiling
    }));
    assert!(h.meta.correction.is_none(), "no round from an impossible version");
    let mut high = follow_up(&a, &[]);
    high.max_observed_version = above;
    assert_eq!(h.send(&high).unwrap().status, Status::Ok, "the member itself is served");

    h.apply(Input::Heartbeat(&stranger_leave(ceiling)));
    assert_eq!(
        h.meta.correction.as_ref().map(|r| r.reported_max_version),
        Some(ceiling),
        "the highest version a lost history can reach still counts"
    );
}

#[test]
fn the_version_retired_at_the_close_is_one_heartbeats_may_echo() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let ceiling = report_ceiling(h.meta.metadata_version, h.now);
    h.send(&stranger_leave(ceiling)).unwrap();
    h.advance(TTL);
    let mut synced = follow_up(&a, &[]);
    synced.max_observed_version = synced.metadata_version;
    let r = h.send(&synced).unwrap();
    assert_eq!(r.status, Status::Ok);
    assert!(h.meta.correction.is_none());
    assert_eq!(r.metadata_version, MetadataVersion(ceiling.0 + 1));
    assert_eq!(h.send(&follow_up(&r, &[])).unwrap().status, Status::Ok);
}

#[test]
fn a_round_recorded_with_an_unbounded_report_closes_within_the_limit() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    // Written by a build that did not bound reports: the close must not produce 2^53 + 1.
    h.meta.correction = Some(CorrectionRound {
        started_at_ms: h.now,
        reported_max_version: MetadataVersion(1 << 53),
        synced: Default::default(),
        claims: Default::default(),
    });
    h.advance(TTL);
    let r = h.send(&follow_up(&a, &[])).unwrap();
    assert!(h.meta.correction.is_none());
    assert_eq!(r.metadata_version, MetadataVersion(REPORT_LIMIT.0 + 1));
    assert_eq!(h.send(&follow_up(&r, &[])).unwrap().status, Status::Ok);
}

#[test]
fn the_stored_version_never_passes_the_wire_limit() {
    let mut h = Harness::new(2);
    h.meta.metadata_version = MetadataVersion::MAX_SAFE;
    let a = h.join("a");
    assert_eq!(h.meta.metadata_version, MetadataVersion::MAX_SAFE);
    assert_eq!(h.send(&follow_up(&a, &[])).unwrap().status, Status::Ok);
}

#[test]
fn ever_higher_reports_do_not_hold_a_round_open() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let opened = h.now;
    let mut last = a.clone();
    let mut v = h.meta.metadata_version.0 + 1;
    while h.now < opened + 3 * TTL {
        h.send(&stranger_leave(MetadataVersion(v))).unwrap();
        v += 1;
        last = h.send(&follow_up(&last, &[])).unwrap();
        h.tick();
        if h.meta.correction.is_none() {
            break;
        }
        h.advance(INTERVAL);
    }
    assert!(
        h.meta.correction.is_none(),
        "the round closes one TTL after it opened, whatever is reported after"
    );
    assert!(h.now <= opened + TTL + INTERVAL, "closed at {}", h.now - opened);
}

#[test]
fn a_member_that_never_adopts_the_stored_version_is_fenced_after_the_rebalance_timeout() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let b = h.join("b");
    let mut stubborn = follow_up(&b, &[]);
    stubborn.metadata_version = MetadataVersion(h.meta.metadata_version.0 + 5);
    stubborn.max_observed_version = stubborn.metadata_version;
    let opened = h.now;
    let mut a_last = a;
    while h.meta.members[&member("b")].fenced_at_ms.is_none() && h.now < opened + 3 * TTL {
        assert_eq!(h.send(&stubborn).unwrap().status, Status::SyncMetadata);
        let acks: Vec<u32> = a_last.revoke.iter().map(|s| s.0).collect();
        a_last = h.send(&follow_up(&a_last, &acks)).unwrap();
        h.advance(INTERVAL);
        h.tick();
    }
    assert_eq!(
        h.meta.members[&member("b")].fenced_at_ms,
        Some(opened + REBALANCE),
        "b never synced: fenced at the rebalance timeout, so the round can close"
    );
    assert!(
        h.meta.members[&member("a")].fenced_at_ms.is_none(),
        "a synced: it is not fenced"
    );
}

/// A join naming an incarnation no coordinator of the group can have minted (well formed, so not a 400: the
/// OpenAPI positive run sends such numbers) is taken as naming none: a new process's join, with a fresh
/// incarnation that stays within what the group can mint.
#[test]
fn an_implausible_incarnation_names_nothing() {
    let mut h = Harness::new(2);
    let ceiling = super::incarnation::ceiling(&h.meta, h.now);
    let mut join = req("a", 0, MetadataVersion(0), &[], &[]);
    join.incarnation = protocol::Incarnation(ceiling.0 + 1);
    let t = h.apply(Input::Heartbeat(&join));
    assert!(t.events.contains(&Event::ImplausibleIncarnationIgnored {
        named: join.incarnation,
        ceiling
    }));
    let Outcome::Heartbeat(r) = &t.outcome else {
        panic!("answered: {:?}", t.outcome)
    };
    assert_eq!(r.status, Status::Ok);
    assert!(r.incarnation <= ceiling, "{:?} above {ceiling:?}", r.incarnation);
}
