//! The supervisor's schedules under paused Tokio time, against an in-memory coordinator
//! (`client_core::testing::FakeCoord`): heartbeat times, backoff during an outage, lease expiry, rejoin after a
//! fence. Every instant is exact; nothing sleeps on the wall clock.

use client_core::testing::{FakeCoord, Reply};
use client_core::MemoryVersionStore;
use protocol::messages::HeartbeatResponse;
use protocol::names::MemberId;
use protocol::{AssignmentEpoch, MemberEpoch, MetadataVersion, RoutingVersion, ShardId, Status};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::{Consumer, ConsumerHandle, ConsumerStatus, Message};

const MS: Duration = Duration::from_millis(1);

fn ok(epoch: i64, assigned: &[u32], lease_ms: u64, interval_ms: u64) -> HeartbeatResponse {
    HeartbeatResponse {
        status: Status::Ok,
        member_id: MemberId::new("m1").unwrap(),
        incarnation: protocol::Incarnation(1),
        member_epoch: MemberEpoch(epoch),
        metadata_version: MetadataVersion(3),
        assignment_epoch: AssignmentEpoch(1),
        assigned: assigned.iter().map(|&s| ShardId(s)).collect(),
        fencing_tokens: vec![],
        pending: vec![],
        revoke: vec![],
        heartbeat_interval_ms: interval_ms,
        assignment_lease_ms: lease_ms,
        shard_count: 8,
        routing_version: RoutingVersion(1),
    }
}

/// A consumer whose coordinator is `fake`. Its Redis is a closed port: readers started here fail to read (and
/// keep retrying), which the schedules under test do not depend on.
fn spawn(fake: &FakeCoord) -> ConsumerHandle {
    Consumer::builder("orders", "billing")
        .coordinator("http://127.0.0.1:1")
        .redis("redis://127.0.0.1:1")
        .member_id("m1")
        .heartbeat_interval(200 * MS)
        .member_ttl(2000 * MS)
        .assignment_lease(1500 * MS)
        .lease_safety_margin(100 * MS)
        .request_timeout(300 * MS)
        .read_failure_timeout(Duration::from_secs(3600))
        .version_store(MemoryVersionStore::default())
        .handler(|_m: Message| async { Ok::<_, std::io::Error>(()) })
        .build()
        .unwrap()
        .spawn_with_transport(Arc::new(fake.clone()))
}

/// Arrival times of the heartbeats, relative to `t0`.
fn heartbeat_times(fake: &FakeCoord, t0: Instant) -> Vec<Duration> {
    fake.heartbeats().iter().map(|(at, _)| *at - t0).collect()
}

/// The first status that satisfies `f`, within a (paused-time) deadline.
async fn wait_for(c: &ConsumerHandle, what: &str, f: impl Fn(&ConsumerStatus) -> bool) -> ConsumerStatus {
    let mut rx = c.watch_status();
    let wait = async {
        loop {
            let s = rx.borrow_and_update().clone();
            if f(&s) {
                return s;
            }
            rx.changed().await.expect("the consumer publishes until it stops");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}: {:?}", c.status()))
}

#[tokio::test(start_paused = true)]
async fn heartbeats_go_out_one_interval_after_each_send() {
    let fake = FakeCoord::new();
    // Answered after 30 ms: the next heartbeat is planned from the send, not from the answer.
    fake.on_heartbeat(|_| Reply::answer(ok(1, &[], 1500, 200)).after(30 * MS));
    let t0 = Instant::now();
    let c = spawn(&fake);
    tokio::time::sleep(990 * MS).await;
    assert_eq!(heartbeat_times(&fake, t0), [0, 200, 400, 600, 800].map(|ms| ms * MS));
    let reqs = fake.heartbeats();
    assert_eq!(reqs[0].1.member_epoch, MemberEpoch::JOIN);
    assert!(reqs[1..].iter().all(|(_, r)| r.member_epoch == MemberEpoch(1)));
    c.abort().await;
}

#[tokio::test(start_paused = true)]
async fn the_coordinator_interval_is_capped_at_half_the_effective_lease() {
    let fake = FakeCoord::new();
    // Lease 1000 ms, minus the 100 ms margin: 900 ms; a 5 s interval would let it run out between heartbeats.
    fake.on_heartbeat(|_| Reply::answer(ok(1, &[], 1000, 5000)));
    let t0 = Instant::now();
    let c = spawn(&fake);
    tokio::time::sleep(1000 * MS).await;
    assert_eq!(heartbeat_times(&fake, t0), [0, 450, 900].map(|ms| ms * MS));
    c.abort().await;
}

#[tokio::test(start_paused = true)]
async fn an_outage_is_retried_with_backoff_capped_at_the_interval_within_the_lease() {
    let fake = FakeCoord::new();
    let mut n = 0;
    fake.on_heartbeat(move |_| {
        n += 1;
        if n == 1 {
            Reply::answer(ok(1, &[], 1500, 200))
        } else {
            Reply::unreachable()
        }
    });
    let t0 = Instant::now();
    let c = spawn(&fake);
    tokio::time::sleep(1000 * MS).await;
    let times = heartbeat_times(&fake, t0);
    assert_eq!(times[1], 200 * MS, "the first failing heartbeat is a regular one");
    let gaps: Vec<Duration> = times.windows(2).skip(1).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() >= 4, "retried: {times:?}");
    assert!(
        gaps.iter().all(|g| *g >= 50 * MS && *g <= 200 * MS),
        "jittered backoff from 50 ms, never longer than the interval: {gaps:?}"
    );
    let s = c.status();
    assert_eq!(s.heartbeats.failed as usize, times.len() - 1);
    assert_eq!(
        s.member_epoch,
        MemberEpoch(1),
        "still a member: the failures are retried, not a rejoin"
    );
    assert_eq!(
        s.lease_expires_at,
        Some(t0.into_std() + 1400 * MS),
        "the lease of the join (1500 ms minus the margin, from its send time) is not extended by failures"
    );

    // The coordinator is back: the same member goes on, and the backoff is reset.
    fake.on_heartbeat(|_| Reply::answer(ok(1, &[], 1500, 200)));
    let recovered = wait_for(&c, "an answer after the outage", |s| s.heartbeats.ok >= 2).await;
    let back_at = fake.heartbeats().last().unwrap().0;
    assert_eq!(recovered.member_epoch, MemberEpoch(1));
    tokio::time::sleep_until(back_at + 250 * MS).await;
    let after: Vec<Duration> = fake
        .heartbeats()
        .iter()
        .filter(|(at, _)| *at > back_at)
        .map(|(at, _)| *at - back_at)
        .collect();
    assert_eq!(after, vec![200 * MS], "the regular interval again");
    c.abort().await;
}

#[tokio::test(start_paused = true)]
async fn readers_stop_when_the_lease_runs_out_during_a_coordinator_outage() {
    let fake = FakeCoord::new();
    let mut n = 0;
    fake.on_heartbeat(move |_| {
        n += 1;
        if n == 1 {
            Reply::answer(ok(1, &[0], 1000, 200))
        } else {
            // Each heartbeat times out, as the HTTP client's request timeout would end it.
            Reply::unreachable().after(300 * MS)
        }
    });
    let t0 = Instant::now();
    let c = spawn(&fake);
    let reading = wait_for(&c, "shard 0 read", |s| s.reading == vec![ShardId(0)]).await;
    assert_eq!(reading.lease_expires_at, Some(t0.into_std() + 900 * MS));
    let expired = wait_for(&c, "the lease to run out", |s| s.heartbeats.lease_expiries >= 1).await;
    assert_eq!(
        t0.elapsed(),
        900 * MS,
        "stopped exactly at the lease end (join sent at 0, 1000 - 100 ms)"
    );
    assert!(expired.reading.is_empty(), "{expired:?}");
    assert_eq!(
        expired.revoking,
        vec![ShardId(0)],
        "in local revoking state, not read again"
    );
    // Failing heartbeats never resume it.
    tokio::time::sleep(2000 * MS).await;
    let s = c.status();
    assert!(s.reading.is_empty() && s.heartbeats.failed >= 5, "{s:?}");
    c.abort().await;
}

#[tokio::test(start_paused = true)]
async fn a_fenced_member_rejoins_with_epoch_zero_promptly() {
    let fake = FakeCoord::new();
    let mut n = 0;
    fake.on_heartbeat(move |_| {
        n += 1;
        match n {
            1 => Reply::answer(ok(1, &[], 1500, 200)),
            2 => Reply::refuse(Status::FencedMemberEpoch),
            _ => Reply::answer(ok(2, &[], 1500, 200)),
        }
    });
    let t0 = Instant::now();
    let c = spawn(&fake);
    let s = wait_for(&c, "the rejoin", |s| {
        s.heartbeats.rejoins == 1 && s.member_epoch == MemberEpoch(2)
    })
    .await;
    assert_eq!(s.heartbeats.fenced, 1);
    let reqs = fake.heartbeats();
    let epochs: Vec<MemberEpoch> = reqs.iter().map(|(_, r)| r.member_epoch).collect();
    assert_eq!(epochs[..3], [MemberEpoch::JOIN, MemberEpoch(1), MemberEpoch::JOIN]);
    assert_eq!(
        heartbeat_times(&fake, t0)[..3],
        [0, 200, 205].map(|ms| ms * MS),
        "the rejoin goes out at once (the 5 ms prompt delay), not after an interval"
    );
    c.abort().await;
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_in_flight_past_the_lease_end_does_not_hold_the_readers_and_its_late_answer_resumes_nothing() {
    let fake = FakeCoord::new();
    let mut n = 0;
    fake.on_heartbeat(move |_| {
        n += 1;
        if n == 1 {
            Reply::answer(ok(1, &[0], 1000, 200))
        } else {
            // A coordinator too slow to answer within the lease: the answer comes 3 s after the send.
            Reply::answer(ok(1, &[0], 1000, 200)).after(3000 * MS)
        }
    });
    let t0 = Instant::now();
    let c = spawn(&fake);
    wait_for(&c, "shard 0 read", |s| s.reading == vec![ShardId(0)]).await;
    let expired = wait_for(&c, "the lease to run out", |s| s.heartbeats.lease_expiries >= 1).await;
    assert_eq!(
        t0.elapsed(),
        900 * MS,
        "at the lease end, while the heartbeat sent at 200 ms is in flight"
    );
    assert_eq!(heartbeat_times(&fake, t0), [0, 200].map(|ms| ms * MS));
    assert_eq!((expired.reading.len(), expired.revoking.clone()), (0, vec![ShardId(0)]));
    // The late answer (sent at 200 ms, its lease ended at 1100 ms) arrives at 3200 ms: nothing resumes.
    let late = wait_for(&c, "the late answer", |s| s.heartbeats.ok >= 2).await;
    assert_eq!(t0.elapsed(), 3200 * MS);
    assert!(late.reading.is_empty(), "{late:?}");
    tokio::time::sleep(5000 * MS).await;
    assert!(c.status().reading.is_empty(), "{:?}", c.status());
    c.abort().await;
}

#[tokio::test(start_paused = true)]
async fn close_leaves_with_epoch_minus_one_retrying_a_failed_leave_after_100_then_200_ms() {
    let fake = FakeCoord::new();
    let mut failed_leaves = 0;
    fake.on_heartbeat(move |req| {
        if req.member_epoch.is_leave() && failed_leaves < 2 {
            failed_leaves += 1;
            return Reply::unreachable();
        }
        Reply::answer(ok(1, &[], 1500, 200))
    });
    let c = spawn(&fake);
    wait_for(&c, "joined", |s| s.joined).await;
    let closing_at = Instant::now();
    let report = c.close().await.unwrap();
    assert!(report.left, "the third attempt was answered");
    let leaves: Vec<Duration> = fake
        .heartbeats()
        .iter()
        .filter(|(_, r)| r.member_epoch.is_leave())
        .map(|(at, _)| *at - closing_at)
        .collect();
    assert_eq!(leaves, [0, 100, 300].map(|ms| ms * MS));
}

#[tokio::test(start_paused = true)]
async fn a_rejoin_over_the_member_quota_stops_the_consumer_instead_of_looping() {
    let fake = FakeCoord::new();
    let mut n = 0;
    fake.on_heartbeat(move |_| {
        n += 1;
        match n {
            1 => Reply::answer(ok(1, &[], 1500, 200)),
            2 => Reply::refuse(Status::FencedMemberEpoch),
            // The group filled up while this member was out: the join stays refused until an operator acts.
            _ => Reply::refuse(Status::QuotaExceeded),
        }
    });
    let c = spawn(&fake);
    tokio::time::timeout(Duration::from_secs(60), async {
        while !c.is_finished() {
            tokio::time::sleep(10 * MS).await;
        }
    })
    .await
    .expect("the consumer stops after the refused rejoin");
    assert_eq!(fake.heartbeats().len(), 3, "no retry of the refused join");
    let err = c.close().await.expect_err("stopped with the refusal");
    assert_eq!(err.coordinator_status(), Some(Status::QuotaExceeded), "{err}");
}
