//! Heartbeats a buggy or hostile client, or a slow network, can produce, against a real Redis and the coordinator
//! in-process: reported versions no lost history reaches, ever higher reports, and requests that arrive after
//! later ones. None may kill, stall or fence a healthy group.

mod common;

use common::*;
use protocol::messages::{HeartbeatRequest, HeartbeatResponse, RevokeState, RevokingShard};
use protocol::{MemberEpoch, MetadataVersion, ShardId, Status};
use reqwest::StatusCode;
use std::time::{Duration, Instant};
use test_support::wait_for;

const S: &str = "orders";
const G: &str = "billing";
const WAIT: Duration = Duration::from_secs(10);
/// 2^53 - 1: the largest version a heartbeat may carry.
const JSON_SAFE: u64 = (1 << 53) - 1;

/// A leave from a member the group does not know, reporting `version` as its highest observed version.
fn stranger_leave(version: u64) -> HeartbeatRequest {
    let mut r = join("stranger");
    r.member_epoch = MemberEpoch::LEAVE;
    r.max_observed_version = MetadataVersion(version);
    r
}

/// `last`'s follow-up reading `reading` and draining `draining` (nothing acknowledged).
fn draining(last: &HeartbeatResponse, reading: &[u32], draining: &[u32]) -> HeartbeatRequest {
    let mut r = follow_up(last, &shards(reading));
    r.revoking = draining
        .iter()
        .map(|&s| RevokingShard {
            shard: ShardId(s),
            state: RevokeState::Draining,
        })
        .collect();
    r
}

/// Heartbeats `last`'s member as a healthy consumer (acks every drain at once) until `done` holds for an answer,
/// asserting each answer with `check`. Returns the last answer.
async fn heartbeat_until(
    api: &Api,
    mut last: HeartbeatResponse,
    mut check: impl FnMut(&HeartbeatResponse),
    mut done: impl FnMut(&HeartbeatResponse) -> bool,
) -> HeartbeatResponse {
    let deadline = Instant::now() + WAIT;
    let mut reading = reading_after(&last, &[]);
    loop {
        let r = match api.heartbeat(S, G, &follow_up(&last, &reading)).await {
            Ok(r) => r,
            Err((status, body)) => panic!("healthy member refused: {status} {body:?}"),
        };
        check(&r);
        reading = reading_after(&r, &reading);
        last = r;
        if done(&last) {
            return last;
        }
        assert!(Instant::now() < deadline, "still waiting after {WAIT:?}: {last:?}");
        // A wait on `done` with a deadline, written out: it runs in a spawned task, where the polling helpers'
        // async closures cannot be proven `Send`. The pause is the member's heartbeat interval.
        tokio::time::sleep(interval()).await;
    }
}

fn interval() -> Duration {
    Duration::from_millis(timings().heartbeat_interval_ms)
}

fn ttl() -> Duration {
    Duration::from_millis(timings().member_ttl_ms)
}

#[tokio::test]
async fn a_leave_reporting_2_pow_53_leaves_the_group_alive() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let a = api.hb(S, G, &join("a")).await;

    // 2^53 passed validation before and opened a round that closed at 2^53 + 1, a version every later heartbeat
    // echoing it was refused for. Now it is refused itself (400), and 2^53 - 1 is ignored.
    match api.heartbeat(S, G, &stranger_leave(1 << 53)).await {
        Ok(_) => {}
        Err((status, body)) => {
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(body.status, Status::InvalidRequest);
        }
    }
    let _ = api.heartbeat(S, G, &stranger_leave(JSON_SAFE)).await;

    // Heartbeat past the point where the round would have closed (one member TTL), plus a margin.
    let until = Instant::now() + 2 * ttl();
    let last = heartbeat_until(
        &api,
        a,
        |r| {
            assert!(
                r.metadata_version <= MetadataVersion(JSON_SAFE),
                "answered a version heartbeats may not echo: {r:?}"
            )
        },
        |_| Instant::now() >= until,
    )
    .await;
    assert_eq!(last.status, Status::Ok);
    let group = api.describe(S, G).await;
    assert!(group.correction.is_none(), "{:?}", group.correction);
    assert!(group.metadata_version < MetadataVersion(1 << 40));
    coord.shutdown().await;
}

#[tokio::test]
async fn ever_higher_reports_do_not_hold_a_round_open() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let a = api.hb(S, G, &join("a")).await;
    let base = a.metadata_version.0;
    let member_api = api.clone();
    let member = tokio::spawn(async move {
        heartbeat_until(&member_api, a, |_| {}, |_| false).await;
    });

    // A stranger reports a slightly higher version with every request, for as long as the test runs.
    let spam_api = api.clone();
    let spammer = tokio::spawn(async move {
        for i in 1.. {
            let _ = spam_api.heartbeat(S, G, &stranger_leave(base + i)).await;
            // Real time: the stranger's pace, against the coordinator's clock.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let first = wait_for(WAIT, "a round opened by the stranger", || {
        let api = api.clone();
        async move { api.describe(S, G).await.correction }
    })
    .await;
    let seen = Instant::now();
    // The round ends one member TTL after it opened, whatever is reported meanwhile (a new one may follow).
    let next = wait_for(WAIT, "the first round to end", || {
        let api = api.clone();
        let started = first.started_at_ms;
        async move {
            let c = api.describe(S, G).await.correction;
            match c {
                Some(c) if c.started_at_ms == started => None,
                other => Some(other),
            }
        }
    })
    .await;
    let took = seen.elapsed();
    spammer.abort();
    member.abort();
    let ttl_ms = timings().member_ttl_ms;
    if let Some(c) = next {
        assert!(
            c.started_at_ms >= first.started_at_ms + ttl_ms,
            "the round's wait was restarted by a client report: {} then {}",
            first.started_at_ms,
            c.started_at_ms
        );
    }
    assert!(took < 3 * ttl(), "the round lasted {took:?}");
    coord.shutdown().await;
}

#[tokio::test]
async fn a_late_duplicate_drain_report_neither_stalls_nor_fences() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 4).await;
    let a1 = api.hb(S, G, &join("a")).await;
    let b1 = api.hb(S, G, &join("b")).await;
    let a2 = api.hb(S, G, &follow_up(&a1, &shards(&[0, 1, 2, 3]))).await;
    assert_eq!(a2.revoke, shards(&[2, 3]));
    // a reports draining 2 and 3; the request times out at the client and stays in the network.
    let late = draining(&a2, &[0, 1], &[2, 3]);
    // a acks 2 while 3 is still draining: 2 goes to b, a's epoch stays current.
    let mut ack = draining(&a2, &[0, 1], &[3]);
    ack.revoking.push(RevokingShard {
        shard: ShardId(2),
        state: RevokeState::Revoked,
    });
    let a3 = api.hb(S, G, &ack).await;
    assert_eq!(a3.member_epoch, late.member_epoch);
    // Now the late request arrives.
    let _ = api.heartbeat(S, G, &late).await;
    let group = api.describe(S, G).await;
    assert!(
        group.correction.is_none(),
        "a late request opened a round: {:?}",
        group.correction
    );

    // Both go on as healthy members: nobody is held in REVOKE_PENDING, fenced, or refused, and b gets 2 and 3.
    let no_stall = |r: &HeartbeatResponse| {
        assert_ne!(r.status, Status::RevokePending, "stalled: {r:?}");
        assert_ne!(r.status, Status::SyncMetadata, "stalled: {r:?}");
    };
    let a_last = heartbeat_until(&api, a3, no_stall, |r| r.revoke.is_empty()).await;
    let b_last = heartbeat_until(&api, b1, no_stall, |r| r.assigned == shards(&[2, 3])).await;
    assert_eq!(a_last.assigned, shards(&[0, 1]));
    assert_eq!(b_last.status, Status::Ok);
    let group = api.describe(S, G).await;
    assert!(group.members.iter().all(|m| !m.fenced), "{:?}", group.members);
    coord.shutdown().await;
}

#[tokio::test]
async fn a_late_revoked_ack_from_before_the_drain_instruction_frees_nothing() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let a1 = api.hb(S, G, &join("a")).await;
    // a's lease ran out: it stopped 0 and 1 and reports them REVOKED; they are still a's, so it reads them again.
    let mut stopped = follow_up(&a1, &[]);
    stopped.revoking = shards(&[0, 1])
        .into_iter()
        .map(|shard| RevokingShard {
            shard,
            state: RevokeState::Revoked,
        })
        .collect();
    let a2 = api.hb(S, G, &stopped).await;
    assert_eq!(a2.assigned, shards(&[0, 1]));
    api.hb(S, G, &join("b")).await;
    // The same request, duplicated in the network, arrives after b joined.
    let _ = api.heartbeat(S, G, &stopped).await;
    let group = api.describe(S, G).await;
    let owners: Vec<Option<&str>> = group
        .shards
        .iter()
        .map(|s| s.owner.as_ref().map(|m| m.as_str()))
        .collect();
    assert_eq!(owners, vec![Some("a"), Some("a")], "a still reads both until it drains");
    coord.shutdown().await;
}

/// Every number a heartbeat carries has the bound the OpenAPI document states, enforced before anything is done:
/// a stranger's report of a higher metadata version with an out-of-range routing report, shard count or
/// incarnation is refused (400) and opens no round (found by the OpenAPI negative run: such a request was accepted
/// and its version report opened a correction round).
#[tokio::test]
async fn out_of_range_report_fields_are_refused_and_change_nothing() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let before = api.describe(S, G).await;
    let bad: [fn(&mut HeartbeatRequest); 3] = [
        |r| r.max_shard_count = 65_537,
        |r| r.max_routing_version = protocol::RoutingVersion(1 << 53),
        |r| r.incarnation = protocol::Incarnation(1 << 53),
    ];
    for (i, set) in bad.iter().enumerate() {
        let mut r = stranger_leave(before.metadata_version.0 + 50);
        set(&mut r);
        let (status, body) = api.heartbeat(S, G, &r).await.expect_err("refused");
        assert_eq!(
            (status, body.status),
            (StatusCode::BAD_REQUEST, Status::InvalidRequest),
            "case {i}"
        );
    }
    let after = api.describe(S, G).await;
    assert_eq!(after.metadata_version, before.metadata_version);
    assert!(after.correction.is_none(), "{:?}", after.correction);
    coord.shutdown().await;
}
