//! Coordinator rolling update (1 → 2 → 1) and temporary coordinator loss (1 → 0 → 1): two instances on one
//! Redis stay consistent (the mutex serialises them, the revision compare-and-set catches a writer that outlived
//! its mutex and makes it decide again), the terminating one answers `503 COORDINATOR_TERMINATING` with
//! `Connection: close` while clients move to the other, and no consumer stops reading when the update is shorter
//! than its lease.

mod common;

use common::*;
use coord_server::fault::{Action, Point};
use protocol::messages::RevokeState;
use protocol::Status;
use reqwest::StatusCode;
use scenario_tests::History;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream_consumer::ConsumerHandle;

/// No consumer's lease ran out, and every one is still reading under an `OK`.
fn kept_reading(handles: &[&ConsumerHandle]) {
    for h in handles {
        let st = h.status();
        assert_eq!(
            st.heartbeats.lease_expiries,
            0,
            "{} stopped reading: {st:?}",
            h.member_id()
        );
        assert!(!st.reading.is_empty() && st.last_status == Some(Status::Ok), "{st:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_one_two_one_moves_every_client_to_the_new_instance_without_a_gap_in_reading() {
    let mut s = Scenario::start("roll121", 6).await;
    let new = s.reserve_coordinator();
    let history = History::new();
    let producer = Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(5), 12);
    let a = s.spawn_consumer("a", &history);
    let b = s.spawn_consumer("b", &history);
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "three shards each", |st| {
            st.reading.len() == 3 && st.revoking.is_empty()
        })
        .await;
    }
    let window = Instant::now();

    // 1 -> 2: the new instance starts; a member that prefers it joins, so both instances decide for the group.
    let redis_url = s.redis.url();
    s.coords[new].restart_on(&redis_url).await;
    let c = spawn_preferring(&s, "c", &history, vec![s.coords[new].url(), s.coords[0].url()]);
    for h in [&a, &b, &c] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    assert!(s.coords[0].coordinator().stats().heartbeats_ok.load(Ordering::Relaxed) > 0);
    assert!(
        s.coords[new]
            .coordinator()
            .stats()
            .heartbeats_ok
            .load(Ordering::Relaxed)
            > 0
    );

    // 2 -> 1: the old instance terminates. New mutations get 503 COORDINATOR_TERMINATING with Connection: close.
    s.coords[0].handle().begin_shutdown();
    let old_api = s.api_of(0);
    let refused = old_api
        .heartbeat_request(&WireMember::new("probe").request(RevokeState::Revoked))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused
            .headers()
            .get("connection")
            .map(|v| v.to_str().unwrap().to_owned()),
        Some("close".to_owned())
    );
    let body: protocol::messages::ErrorResponse = refused.json().await.unwrap();
    assert_eq!(
        (body.status, body.retry_after_ms),
        (Status::CoordinatorTerminating, Some(200))
    );
    // Clients move to the new instance: its heartbeat count grows for every member.
    let on_new = s.coords[new]
        .coordinator()
        .stats()
        .heartbeats_ok
        .load(Ordering::Relaxed);
    test_support::wait_until(DEADLINE, "every member to heartbeat the new instance", || {
        let now = s.coords[new]
            .coordinator()
            .stats()
            .heartbeats_ok
            .load(Ordering::Relaxed);
        async move { now >= on_new + 9 }
    })
    .await;
    s.coords[0].shutdown().await;
    let before = s.coords[new]
        .coordinator()
        .stats()
        .heartbeats_ok
        .load(Ordering::Relaxed);
    test_support::wait_until(DEADLINE, "heartbeats to go on with one instance", || {
        let now = s.coords[new]
            .coordinator()
            .stats()
            .heartbeats_ok
            .load(Ordering::Relaxed);
        async move { now >= before + 9 }
    })
    .await;

    let outcomes = publisher.stop().await;
    assert_eq!(
        outcomes.not_written + outcomes.unknown,
        0,
        "publishing never stopped: {outcomes:?}"
    );
    kept_reading(&[&a, &b, &c]);
    let gap = history.longest_gap(window, Instant::now());
    assert!(gap < LEASE - MARGIN, "nobody read anything for {gap:?}");
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    for h in [a, b, c] {
        h.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_loss_one_zero_one_shorter_than_the_lease_keeps_every_consumer_reading() {
    let mut s = Scenario::start("roll101", 4).await;
    let history = History::new();
    let producer = Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(5), 8);
    let a = s.spawn_consumer("a", &history);
    let b = s.spawn_consumer("b", &history);
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    let window = Instant::now();

    // 1 -> 0: the only instance stops; for a while no coordinator answers at all.
    s.coords[0].shutdown().await;
    let down = Instant::now();
    let failed = a.status().heartbeats.failed;
    wait_status(&a, DEADLINE, "a's heartbeats to fail", |st| {
        st.heartbeats.failed > failed
    })
    .await;
    // 0 -> 1 well within the lease: the same URL answers again. Real time: the outage lasts a third of the
    // lease on the consumers' clocks.
    tokio::time::sleep((LEASE - MARGIN) / 3).await;
    s.coords[0].restart().await;
    let outage = down.elapsed();
    assert!(
        outage < LEASE - MARGIN,
        "the outage ({outage:?}) must be shorter than the lease for this scenario"
    );
    let ok = a.status().heartbeats.ok;
    wait_status(&a, DEADLINE, "a's heartbeats to succeed again", |st| {
        st.heartbeats.ok > ok + 2
    })
    .await;

    let outcomes = publisher.stop().await;
    assert_eq!(outcomes.not_written + outcomes.unknown, 0, "{outcomes:?}");
    kept_reading(&[&a, &b]);
    let gap = history.longest_gap(window, Instant::now());
    assert!(gap < LEASE - MARGIN, "nobody read anything for {gap:?}");
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_group_retry_a_revision_conflict_instead_of_losing_a_decision() {
    let mut s = Scenario::start("conflict", 4).await;
    let second = s.add_coordinator().await;
    // The first instance decides x's join, then stalls past its mutex TTL before writing.
    let stall = Trigger::once(
        s.coords[0].coordinator(),
        Point::BeforeWrite,
        Action::Delay(MUTEX_TTL + Duration::from_millis(300)),
        on::joined("x"),
    );
    let mut x = WireMember::new("x");
    let x_join = tokio::spawn({
        let api = s.api_of(0);
        let req = x.request(RevokeState::Revoked);
        async move { api.heartbeat(&req).await }
    });
    stall.fired().await;
    // Meanwhile the second instance takes the expired mutex and records y's join.
    let mut y = WireMember::new("y");
    y.ok_retrying(&s.api_of(second)).await;
    // The first instance's write loses the compare-and-set; it reloads, decides again, and records x too.
    let answer = x_join.await.unwrap().expect("x's join is answered, not lost");
    x.apply(&answer, RevokeState::Revoked);
    assert!(
        s.coords[0]
            .coordinator()
            .stats()
            .revision_conflicts
            .load(Ordering::Relaxed)
            >= 1
    );
    let g = s.describe().await;
    assert!(member(&g, "x").is_some() && member(&g, "y").is_some(), "{g:#?}");
    for _ in 0..3 {
        x.ok(&s.api_of(0)).await;
        y.ok(&s.api_of(second)).await;
    }
    assert_eq!((x.reading.len(), y.reading.len()), (2, 2));
    assert_no_two_readers(&[&x, &y]);
    assert_no_split(&s.describe().await);
}

/// A consumer whose coordinator URLs are tried in the given order.
fn spawn_preferring(s: &Scenario, member: &str, history: &History, urls: Vec<String>) -> ConsumerHandle {
    let builder = consumer_builder(&s.stream, &s.group, member, urls, s.redis.url());
    Scenario::spawn_with(builder, member, history, &Gate::open())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_decided_by_one_instance_loses_to_a_renewal_recorded_by_the_other() {
    let mut s = Scenario::start("renewal-race", 4).await;
    // The second instance serves requests but does not tick: only the first one decides expiries.
    let second = s
        .add_coordinator_with(|c| c.tick_interval = Duration::from_secs(3600))
        .await;
    let (mut a, mut b) = (WireMember::new("a"), WireMember::new("b"));
    a.ok(&s.api_of(0)).await;
    b.ok(&s.api_of(0)).await;
    let keep_a = keep_alive(&s.api_of(second), &a);

    // b falls silent; the first instance decides to expire it and stalls past its mutex TTL before writing.
    let stall = Trigger::once(
        s.coords[0].coordinator(),
        Point::BeforeWrite,
        Action::Delay(MUTEX_TTL + Duration::from_millis(300)),
        on::expired("b"),
    );
    stall.fired().await;
    // b's late heartbeat is recorded by the other instance meanwhile (its lease is renewed).
    let r = s
        .api_of(second)
        .hb_retrying(&b.request(RevokeState::Revoked))
        .await
        .expect("b is still a member");
    b.apply(&r, RevokeState::Revoked);
    // The stale expiry decision loses the compare-and-set (liveness revision) and is decided again: b stays.
    test_support::wait_until(DEADLINE, "the stalled expiry to lose its compare-and-set", || async {
        s.coords[0]
            .coordinator()
            .stats()
            .revision_conflicts
            .load(Ordering::Relaxed)
            >= 1
    })
    .await;
    let g = s.describe().await;
    assert!(member(&g, "b").is_some(), "a renewed member was expired: {g:#?}");
    let r = b.ok(&s.api_of(second)).await;
    assert_eq!(r.status, Status::Ok);
    keep_a.abort();
    assert_no_split(&s.describe().await);
}
