//! A new coordinator resumes from Redis-recorded metadata (seed scenario 11): the old instance crashed in the
//! middle of a rebalance, right after recording it; a new instance on another address finishes it without any
//! of the old instance's memory.

mod common;

use common::*;
use coord_server::fault::{Action, Point};
use protocol::messages::RevokeState;
use protocol::Status;
use scenario_tests::History;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed11_new_coordinator_resumes_a_rebalance_the_old_one_crashed_in() {
    let mut s = Scenario::start("s11", 4).await;
    let next = s.reserve_coordinator();
    let mut a = WireMember::new("a");
    a.ok(&s.api()).await;

    // b's join retargets two of a's shards (W1) and the instance dies before anyone hears of it.
    let mut b = WireMember::new("b");
    let trigger = Trigger::once(s.coordinator(), Point::AfterWrite, Action::Hang, on::joined("b"));
    let join = tokio::spawn(send_heartbeat(&s.api(), b.request(RevokeState::Revoked)));
    trigger.fired().await;
    s.coords[0].abort();
    join.abort();
    drop(trigger);

    // Another instance, on another address, starts from Redis.
    let redis_url = s.redis.url();
    s.coords[next].restart_on(&redis_url).await;
    let api = s.api_of(next);
    let recorded = s.describe().await;
    assert!(
        member(&recorded, "b").is_some(),
        "b's join was recorded before the crash"
    );
    let r = a.beat(&api, RevokeState::Draining).await.unwrap();
    assert_eq!(r.revoke.len(), 2, "the recorded DRAIN: {r:?}");
    let r = b.ok(&api).await;
    let rec_b = member(&recorded, "b").unwrap();
    assert_eq!(
        (r.member_epoch, &r.pending),
        (rec_b.epoch, &rec_b.pending),
        "b's join retry is answered from the record"
    );
    assert!(r.assigned.is_empty());
    a.ok(&api).await;
    let r = b.ok(&api).await;
    assert_eq!((r.status, r.assigned.len()), (Status::Ok, 2), "{r:?}");
    assert_no_two_readers(&[&a, &b]);
    assert_no_split(&s.describe().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed11_consumers_finish_a_rebalance_on_a_new_coordinator_after_the_old_one_crashed_mid_rebalance() {
    let mut s = Scenario::start("s11e2e", 4).await;
    let next = s.reserve_coordinator();
    let history = History::new();
    let producer = Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(10), 8);
    let a = s.spawn_consumer("a", &history);
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;

    let trigger = Trigger::once(s.coordinator(), Point::AfterWrite, Action::Hang, on::joined("b"));
    let b = s.spawn_consumer("b", &history);
    trigger.fired().await;
    s.coords[0].abort();
    drop(trigger);
    let redis_url = s.redis.url();
    s.coords[next].restart_on(&redis_url).await;

    wait_status(&b, DEADLINE, "b reads its half", |st| {
        st.reading.len() == 2 && st.revoking.is_empty()
    })
    .await;
    wait_status(&a, DEADLINE, "a keeps its half", |st| {
        st.reading.len() == 2 && st.revoking.is_empty()
    })
    .await;
    assert_eq!(
        a.status().heartbeats.lease_expiries,
        0,
        "a never stopped reading its kept shards"
    );
    let outcomes = publisher.stop().await;
    assert!(
        outcomes.written > 0 && outcomes.routing_unavailable == 0,
        "{outcomes:?}"
    );
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}
