//! Connection faults through a TCP fault proxy ([`test_support::FaultProxy`]) between clients and Redis and
//! between clients and the coordinator: stalls and resets cost time, never safety. Leases bound the damage: a cut
//! off consumer stops reading before the coordinator hands its shards to someone else.

mod common;

use common::*;
use protocol::Status;
use scenario_tests::History;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::{FaultProxy, Mode};

fn http_url(proxy: &FaultProxy) -> String {
    format!("http://{}", proxy.addr())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_consumer_stops_within_its_lease_and_its_shards_move_only_after_it_expired() {
    let s = Scenario::start("partition", 4).await;
    let history = History::new();
    // a reaches both the coordinator and Redis through proxies; b directly.
    let to_coord = FaultProxy::start(s.coord().addr).await;
    let redis_addr = SocketAddr::from(([127, 0, 0, 1], s.redis.port()));
    let to_redis = FaultProxy::start(redis_addr).await;
    let a = Scenario::spawn_with(
        consumer_builder(&s.stream, &s.group, "a", vec![http_url(&to_coord)], to_redis.url()),
        "a",
        &history,
        &Gate::open(),
    );
    let b = s.spawn_consumer("b", &history);
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    let producer = Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(10), 8);
    let a_shards = shard_set(&a.status().reading);

    // a is cut off from everything: its traffic stalls.
    let a_lease = a.status().lease_expires_at.expect("a holds a lease");
    let cut = Instant::now();
    to_coord.set_mode(Mode::Stall);
    to_redis.set_mode(Mode::Stall);
    wait_status(&a, DEADLINE, "a to stop reading", |st| {
        st.heartbeats.lease_expiries >= 1 && st.reading.is_empty()
    })
    .await;
    assert!(cut.elapsed() <= LEASE + HEARTBEAT, "a read on for {:?}", cut.elapsed());
    wait_status(&b, DEADLINE, "b to take every shard", |st| st.reading.len() == 4).await;
    let taken = history
        .handled()
        .into_iter()
        .filter(|h| h.member == "b" && a_shards.contains(&h.shard) && h.started > cut)
        .map(|h| h.started)
        .min();
    if let Some(first) = taken {
        assert!(first >= a_lease, "b read a's shard before a's lease ended");
    }

    // The partition heals: a learns it was expired and rejoins; the group rebalances.
    to_coord.set_mode(Mode::Pass);
    to_redis.set_mode(Mode::Pass);
    wait_status(&a, DEADLINE, "a reads again", |st| {
        st.reading.len() == 2 && st.revoking.is_empty()
    })
    .await;
    let st = a.status();
    assert!(st.heartbeats.unknown_member >= 1 || st.heartbeats.fenced >= 1, "{st:?}");
    publisher.stop().await;
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_connection_stalled_for_less_than_the_lease_does_not_stop_reading() {
    let s = Scenario::start("stall-coord", 4).await;
    let history = History::new();
    let to_coord = FaultProxy::start(s.coord().addr).await;
    let builder = consumer_builder(&s.stream, &s.group, "a", vec![http_url(&to_coord)], s.redis.url());
    let a = Scenario::spawn_with(builder, "a", &history, &Gate::open());
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    let producer = Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(5), 8);
    let window = Instant::now();

    to_coord.set_mode(Mode::Stall);
    let failed = a.status().heartbeats.failed;
    wait_status(&a, DEADLINE, "a heartbeat to time out", |st| {
        st.heartbeats.failed > failed
    })
    .await;
    to_coord.set_mode(Mode::Pass);
    let ok = a.status().heartbeats.ok;
    wait_status(&a, DEADLINE, "heartbeats to succeed again", |st| {
        st.heartbeats.ok > ok + 2
    })
    .await;

    publisher.stop().await;
    let st = a.status();
    assert_eq!(st.heartbeats.lease_expiries, 0, "{st:?}");
    assert_eq!(st.reading.len(), 4);
    let gap = history.longest_gap(window, Instant::now());
    assert!(gap < LEASE - MARGIN, "reading stopped for {gap:?}");
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    a.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_coordinator_connections_fail_over_to_the_next_url_within_the_same_call() {
    let mut s = Scenario::start("reset-coord", 4).await;
    let second = s.add_coordinator().await;
    let history = History::new();
    let to_first = FaultProxy::start(s.coords[0].addr).await;
    let urls = vec![http_url(&to_first), s.coords[second].url()];
    let a = Scenario::spawn_with(
        consumer_builder(&s.stream, &s.group, "a", urls, s.redis.url()),
        "a",
        &history,
        &Gate::open(),
    );
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;

    to_first.set_mode(Mode::Reset);
    let on_second = s.coords[second]
        .coordinator()
        .stats()
        .heartbeats_ok
        .load(std::sync::atomic::Ordering::Relaxed);
    let failed = a.status().heartbeats.failed;
    test_support::wait_until(DEADLINE, "a's heartbeats to reach the second instance", || {
        let n = s.coords[second]
            .coordinator()
            .stats()
            .heartbeats_ok
            .load(std::sync::atomic::Ordering::Relaxed);
        async move { n >= on_second + 5 }
    })
    .await;
    let st = a.status();
    assert_eq!(
        st.heartbeats.failed, failed,
        "a reset URL costs no failed heartbeat: {st:?}"
    );
    assert_eq!(st.heartbeats.lease_expiries, 0);
    assert_eq!((st.reading.len(), st.last_status), (4, Some(Status::Ok)));
    a.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_redis_connections_lose_no_acknowledged_publish_and_no_shard_is_read_twice_at_once() {
    let s = Scenario::start("reset-redis", 4).await;
    let history = History::new();
    let redis_addr = SocketAddr::from(([127, 0, 0, 1], s.redis.port()));
    let to_redis = FaultProxy::start(redis_addr).await;
    let spawn = |m: &str| {
        Scenario::spawn_with(
            consumer_builder(&s.stream, &s.group, m, s.urls(), to_redis.url()),
            m,
            &history,
            &Gate::open(),
        )
    };
    let a = spawn("a");
    let b = spawn("b");
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    let producer = Arc::new(s.producer().redis(to_redis.url()).build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(5), 8);

    for _ in 0..3 {
        let before = history.acked().len();
        test_support::wait_until(DEADLINE, "progress between resets", || {
            let n = history.acked().len();
            async move { n >= before + 5 }
        })
        .await;
        to_redis.set_mode(Mode::Reset);
        // Real time: the outage lasts a span, during which clients reconnect and are reset again.
        tokio::time::sleep(Duration::from_millis(150)).await;
        to_redis.set_mode(Mode::Pass);
    }
    let outcomes = publisher.stop().await;
    assert!(outcomes.written > 0, "{outcomes:?}");
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    for h in [&a, &b] {
        assert_eq!(
            h.status().heartbeats.lease_expiries,
            0,
            "Redis resets do not touch the leases"
        );
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_whose_redis_connection_stalls_during_a_drain_is_fenced_and_its_shards_move_within_the_rebalance_bound(
) {
    let s = Scenario::start("stall-drain", 4).await;
    let history = History::new();
    let redis_addr = SocketAddr::from(([127, 0, 0, 1], s.redis.port()));
    let to_redis = FaultProxy::start(redis_addr).await;
    let a = Scenario::spawn_with(
        consumer_builder(&s.stream, &s.group, "a", s.urls(), to_redis.url()),
        "a",
        &history,
        &Gate::open(),
    );
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    let producer = Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(10), 8);

    // a's Redis traffic stalls (its readers hang in XREADGROUP / XACK); its heartbeats still go through. a cannot
    // confirm that its reads ended on the server, so it never reports the drained shards REVOKED: the
    // coordinator fences it at the rebalance timeout and moves its shards when its last granted lease (one
    // member TTL from its last heartbeat) ends.
    to_redis.set_mode(Mode::Stall);
    let stalled = Instant::now();
    let b = s.spawn_consumer("b", &history);
    wait_status(&b, DEADLINE, "b reads its half", |st| st.reading.len() == 2).await;
    let took = stalled.elapsed();
    assert!(
        took < REBALANCE_TIMEOUT + TTL + Duration::from_secs(1),
        "the handover took {took:?}, beyond the rebalance timeout and a member TTL"
    );
    to_redis.set_mode(Mode::Pass);
    wait_status(&a, DEADLINE, "a reads its half", |st| {
        st.reading.len() == 2 && st.revoking.is_empty()
    })
    .await;
    publisher.stop().await;
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_cut_off_from_the_coordinator_drops_its_running_handlers_at_its_lease_end_before_anyone_else_reads() {
    let s = Scenario::start("cut-handlers", 4).await;
    let history = History::new();
    let to_coord = FaultProxy::start(s.coord().addr).await;
    let gate = Gate::closed();
    let a = Scenario::spawn_with(
        consumer_builder(&s.stream, &s.group, "a", vec![http_url(&to_coord)], s.redis.url()),
        "a",
        &history,
        &gate,
    );
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    let producer = s.producer().build().unwrap();
    publish(&producer, &history, 0, 16, 16).await;
    wait_status(&a, DEADLINE, "a is inside a handler on every shard", |st| {
        st.in_flight.len() == 4
    })
    .await;

    // a loses the coordinator while its handlers hang: its lease ends, the handlers are dropped, and only after
    // the coordinator expired a (one member TTL after its last heartbeat) does b get the shards and re-handle the
    // entries a never finished.
    to_coord.set_mode(Mode::Stall);
    let b = s.spawn_consumer("b", &history);
    wait_status(&a, DEADLINE, "a's lease to run out", |st| {
        st.heartbeats.lease_expiries >= 1 && st.in_flight.is_empty()
    })
    .await;
    wait_status(&b, DEADLINE, "b takes every shard", |st| st.reading.len() == 4).await;
    wait_all_handled(&history, DEADLINE).await;
    let dropped = history.handled().iter().filter(|h| h.member == "a" && !h.ok).count();
    assert_eq!(dropped, 4, "a's four running handlers were dropped, not finished");
    history.assert_holds();
    to_coord.set_mode(Mode::Pass);
    gate.set(true);
    wait_status(&a, DEADLINE, "a rejoins", |st| {
        st.reading.len() == 2 && st.revoking.is_empty()
    })
    .await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A reader killed without a drain (fence, lease end, `UNKNOWN_MEMBER`) cannot end its read on the server. If the
/// network delivers that read's request late, after the shard's next owner claimed the pending entries at its
/// start, Redis hands the entries that arrived meanwhile to the dead member's pending list. The new owner claims
/// the group's pending entries again at least once per member TTL while it reads, so they are handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_readers_read_delivered_late_by_the_network_strands_no_entry() {
    let s = Scenario::start("stale-read", 1).await;
    let history = History::new();
    let redis_addr = SocketAddr::from(([127, 0, 0, 1], s.redis.port()));
    let to_redis = FaultProxy::start(redis_addr).await;
    let gate_a = Gate::closed();
    let a = Scenario::spawn_with(
        consumer_builder(&s.stream, &s.group, "a", s.urls(), to_redis.url()),
        "a",
        &history,
        &gate_a,
    );
    wait_status(&a, DEADLINE, "a reads the shard", |st| st.reading.len() == 1).await;
    let producer = s.producer().build().unwrap();
    publish(&producer, &history, 0, 1, 1).await;
    wait_status(&a, DEADLINE, "a handles the first entry", |st| st.in_flight.len() == 1).await;

    // a's network to Redis stalls just as its handler finishes: its next XACK + XREADGROUP wait in the network.
    to_redis.set_mode(Mode::Stall);
    gate_a.set(true);
    test_support::wait_until(DEADLINE, "a's handler to return", || {
        let done = history.acked().len() == 1;
        async move { done }
    })
    .await;
    // Not an assertion: lets the reader write its next request into the stalled connection. Real time: the
    // request waits in the kernel's buffers, where nothing can observe it.
    tokio::time::sleep(Duration::from_millis(100)).await;

    // a is fenced (its readers are killed, dropping their connections) and dies; b takes the shard at the end of
    // a's lease and re-handles what a never acknowledged. b's handler is slow.
    let gate_b = Gate::closed();
    let b = s.spawn_gated("b", &history, &gate_b);
    s.api().fence("a", None).await.expect("fence a");
    wait_status(&a, DEADLINE, "a is fenced", |st| st.heartbeats.fenced >= 1).await;
    a.abort().await;
    wait_status(&b, DEADLINE, "b holds the claimed entry", |st| st.in_flight.len() == 1).await;
    // New records arrive while b is busy.
    publish(&producer, &history, 1, 3, 1).await;

    // The network heals: the dead reader's request reaches Redis now.
    to_redis.set_mode(Mode::Pass);
    // Not an assertion: lets the late request reach Redis before b reads again (real time: the request leaves the
    // kernel's buffers on its own; nothing marks its arrival).
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate_b.set(true);
    test_support::wait_until(DEADLINE, "every acknowledged publish to be handled by b", || {
        let done = history.all_published_handled();
        async move { done }
    })
    .await;
    history.assert_holds();
    b.close().await.unwrap();
}
