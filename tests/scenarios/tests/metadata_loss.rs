//! Metadata loss (seed scenario 5, and a Redis restart without persistence): the coordinator fails closed with
//! `METADATA_UNAVAILABLE`, rebuilds nothing from heartbeats, clients stop within their leases, and only an
//! explicit recreate brings the group back.

mod common;

use common::*;
use protocol::messages::RevokeState;
use protocol::Status;
use reqwest::StatusCode;
use scenario_tests::History;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream_consumer::ConsumerHandle;

/// Heartbeats of `m` until one is refused with `status`; returns the refusal's `retryAfterMs`.
async fn refused_with(api: &GroupApi, m: &mut WireMember, status: Status) -> Option<u64> {
    let what = format!("{} to be refused with {status}", m.id);
    let m = tokio::sync::Mutex::new(m);
    test_support::wait_for(DEADLINE, &what, || async {
        match m.lock().await.beat(api, RevokeState::Revoked).await {
            Err((_, e)) if e.status == status => Some(e.retry_after_ms),
            _ => None,
        }
    })
    .await
}

/// After the loss: heartbeats are refused METADATA_UNAVAILABLE again and again, ticks run, and still no
/// metadata appears; create refuses; recreate brings the group back, and old members rejoin.
async fn fail_closed_then_recreate(s: &Scenario, members: &mut [&mut WireMember]) {
    let api = s.api();
    for m in members.iter_mut() {
        let retry = refused_with(&api, m, Status::MetadataUnavailable).await;
        assert_eq!(retry, Some(5000));
    }
    for _ in 0..5 {
        for m in members.iter_mut() {
            let r = m.beat(&api, RevokeState::Revoked).await;
            assert!(
                matches!(&r, Err((StatusCode::SERVICE_UNAVAILABLE, e)) if e.status == Status::MetadataUnavailable),
                "{r:?}"
            );
        }
        // Real time: longer than the coordinator's tick interval, so ticks run between two rounds.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert!(
        !s.metadata_exists().await,
        "nothing was rebuilt from heartbeats or ticks"
    );
    let (status, e) = api.describe().await.unwrap_err();
    assert_eq!(
        (status, e.status),
        (StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable)
    );

    let g = api.recreate(s.shards).await.expect("recreate");
    assert!(g.correction.is_some() && g.members.is_empty(), "{g:#?}");
    let (status, e) = api.recreate(s.shards).await.unwrap_err();
    assert_eq!(
        (status, e.status),
        (StatusCode::CONFLICT, Status::AlreadyExists),
        "recreate is not repeated"
    );
    for m in members.iter_mut() {
        let r = m.beat(&api, RevokeState::Revoked).await;
        assert!(matches!(&r, Err((_, e)) if e.status == Status::UnknownMember), "{r:?}");
        m.restart(&m.instance.clone());
        let r = m.ok(&api).await;
        assert_eq!(
            r.status,
            Status::RevokePending,
            "no shard is handed out before one TTL: {r:?}"
        );
    }
    {
        let members = tokio::sync::Mutex::new(&mut *members);
        test_support::wait_until(DEADLINE, "every member to get OK after the recreate", || async {
            let mut all_ok = true;
            for m in members.lock().await.iter_mut() {
                all_ok &= m.ok(&api).await.status == Status::Ok;
            }
            all_ok
        })
        .await;
    }
    let refs: Vec<&WireMember> = members.iter().map(|m| &**m).collect();
    assert_no_two_readers(&refs);
    assert_no_split(&s.describe().await);
}

// ---- level 2 ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed5_deleted_metadata_key_fails_closed_and_is_not_rebuilt_until_an_explicit_recreate() {
    let s = Scenario::start("s5", 4).await;
    let api = s.api();
    let (mut a, mut b) = (WireMember::new("a"), WireMember::new("b"));
    a.ok(&api).await;
    b.ok(&api).await;
    s.redis.delete_key(&s.metadata_key()).await;

    // create refuses a group the index lists: an operator must choose recreate.
    let (status, e) = api.create(s.shards).await.unwrap_err();
    assert_eq!(
        (status, e.status),
        (StatusCode::CONFLICT, Status::AlreadyExists),
        "{e:?}"
    );
    fail_closed_then_recreate(&s, &mut [&mut a, &mut b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_without_persistence_fails_closed_and_nothing_is_reconstructed() {
    let mut s = Scenario::start("restart", 4).await;
    let api = s.api();
    let (mut a, mut b) = (WireMember::new("a"), WireMember::new("b"));
    a.ok(&api).await;
    b.ok(&api).await;

    s.redis.restart().await;
    let mut con = s.redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut con).await.unwrap();
    assert!(keys.is_empty(), "the restarted Redis is empty: {keys:?}");
    // The stream's routing is gone too: producers are refused, nothing is invented.
    test_support::wait_until(
        DEADLINE,
        "the stream's routing to be refused METADATA_UNAVAILABLE",
        || async { matches!(api.routing(0, 1).await, Err((_, e)) if e.status == Status::MetadataUnavailable) },
    )
    .await;
    fail_closed_then_recreate(&s, &mut [&mut a, &mut b]).await;
}

// ---- level 3 ---------------------------------------------------------------------------------------------------

/// Waits until `h` stopped reading because its lease ran out, at most a lease (and a heartbeat) after `since`.
async fn stops_within_its_lease(h: &ConsumerHandle, since: Instant) {
    wait_status(h, DEADLINE, "the lease to run out and every reader to stop", |st| {
        st.heartbeats.lease_expiries >= 1 && st.reading.is_empty()
    })
    .await;
    let took = since.elapsed();
    assert!(took <= LEASE + HEARTBEAT, "{} read on for {took:?}", h.member_id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed5_deleted_metadata_key_stops_consumers_within_their_leases_and_recreate_brings_them_back() {
    let s = Scenario::start("s5e2e", 4).await;
    let history = History::new();
    let a = s.spawn_consumer("a", &history);
    let b = s.spawn_consumer("b", &history);
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    let producer = s.producer().build().unwrap();
    publish(&producer, &history, 0, 20, 5).await;
    wait_all_handled(&history, DEADLINE).await;

    let deleted = Instant::now();
    s.redis.delete_key(&s.metadata_key()).await;
    stops_within_its_lease(&a, deleted).await;
    stops_within_its_lease(&b, deleted).await;
    assert_eq!(a.status().last_status, Some(Status::MetadataUnavailable));
    let failed = a.status().heartbeats.failed;
    wait_status(&a, DEADLINE, "more refused heartbeats", |st| {
        st.heartbeats.failed >= failed + 3
    })
    .await;
    assert!(
        !s.metadata_exists().await,
        "nothing was rebuilt from the consumers' heartbeats"
    );

    s.api().recreate(s.shards).await.expect("recreate");
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "reading again after the recreate", |st| {
            st.reading.len() == 2 && st.last_status == Some(Status::Ok)
        })
        .await;
    }
    publish(&producer, &history, 20, 20, 5).await;
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_without_persistence_stops_clients_within_their_leases_until_recreated() {
    let mut s = Scenario::start("restart-e2e", 4).await;
    let history = History::new();
    let a = s.spawn_consumer("a", &history);
    let b = s.spawn_consumer("b", &history);
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    let producer = Arc::new(s.producer().build().unwrap());
    publish(&producer, &history, 0, 20, 5).await;
    wait_all_handled(&history, DEADLINE).await;

    let restarted = Instant::now();
    s.redis.restart().await;
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(20), 5);
    stops_within_its_lease(&a, restarted).await;
    stops_within_its_lease(&b, restarted).await;
    // The producer's routing lease runs out with no routing to refresh: it fails closed.
    test_support::wait_until(DEADLINE, "the producer to fail closed", || {
        let expired = producer.lease_remaining().is_none_or(|d| d.is_zero());
        async move { expired }
    })
    .await;
    let refused = producer.send("k", &[("key", "k")]).await.unwrap_err();
    assert!(refused.is_routing_unavailable(), "{refused:?}");
    assert!(!s.metadata_exists().await, "nothing was rebuilt");

    s.api().recreate(s.shards).await.expect("recreate");
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "reading again after the recreate", |st| {
            st.reading.len() == 2 && st.last_status == Some(Status::Ok)
        })
        .await;
    }
    let written = publisher.stop().await.written;
    let more = publish(&producer, &history, 1000, 10, 5).await;
    assert_eq!(more, 10, "publishing resumed after the recreate");
    assert!(written > 0);
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}
