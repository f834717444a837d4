//! Producer routing during failures (seed scenario 10) and while the stream grows: a producer publishes only
//! under a valid routing lease, fails closed when it cannot renew it, and every record it acknowledged is
//! handled, in order per key within a shard.

mod common;

use common::*;
use scenario_tests::History;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream_producer::WriteState;

async fn total_len(s: &Scenario) -> u64 {
    let mut con = s.redis.connection().await;
    let mut total = 0;
    for shard in 0..s.shards {
        let n: u64 = redis::cmd("XLEN")
            .arg(s.shard_key(shard))
            .query_async(&mut con)
            .await
            .expect("XLEN");
        total += n;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed10_producer_cache_expiring_during_a_coordinator_outage_fails_closed_and_resumes_after_recovery() {
    let mut s = Scenario::start("s10e2e", 4).await;
    let history = History::new();
    let a = s.spawn_consumer("a", &history);
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    let producer = s.producer().build().unwrap();
    assert_eq!(publish(&producer, &history, 0, 10, 4).await, 10);

    let outage = Instant::now();
    s.coords[0].abort();
    // Within the routing lease the cached routing keeps publishing going.
    assert!(producer.lease_remaining().is_some_and(|d| !d.is_zero()));
    assert_eq!(
        publish(&producer, &history, 10, 5, 4).await,
        5,
        "published on the cached routing"
    );
    // Past it, every publish fails closed and writes nothing.
    test_support::wait_until(DEADLINE, "the routing lease to run out", || {
        let expired = producer.lease_remaining().is_none_or(|d| d.is_zero());
        async move { expired }
    })
    .await;
    assert!(
        outage.elapsed() >= ROUTING_LEASE - Duration::from_millis(500),
        "{:?}",
        outage.elapsed()
    );
    let before = total_len(&s).await;
    for i in 0..5 {
        let e = publish_one(&producer, &history, 100 + i, 4).await.unwrap_err();
        assert!(e.is_routing_unavailable(), "{e:?}");
        assert_eq!(e.write_state(), WriteState::NotWritten);
    }
    assert_eq!(total_len(&s).await, before, "nothing was written after the lease ended");
    assert!(
        a.status().reading.is_empty(),
        "the consumer's shorter lease ran out too"
    );

    // A coordinator is back: the next refresh restores publishing, the consumer reads again.
    s.coords[0].restart().await;
    test_support::wait_until(DEADLINE, "publishing to resume", || {
        let producer = &producer;
        let history = &history;
        async move { publish_one(producer, history, 200, 4).await.is_ok() }
    })
    .await;
    assert_eq!(publish(&producer, &history, 300, 10, 4).await, 10);
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    producer.close().await.unwrap();
    a.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_shards_while_publishing_loses_no_acknowledged_record_and_keeps_per_key_order_within_a_shard() {
    let s = Scenario::start("grow", 2).await;
    let history = History::new();
    let a = s.spawn_consumer("a", &history);
    let b = s.spawn_consumer("b", &history);
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "one shard each", |st| {
            st.reading.len() == 1 && st.revoking.is_empty()
        })
        .await;
    }
    // The seal refuses a publish routed with the old routing (NotWritten); the producer re-routes and resends it
    // itself, which keeps per-key order here because the publisher sends one record at a time.
    let producer = Arc::new(s.producer().reroute_fenced(true).build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(5), 16);
    test_support::wait_until(DEADLINE, "some records handled", || {
        let n = history.acked().len();
        async move { n >= 20 }
    })
    .await;

    s.api().add_shards(2, None).await.expect("add shards");
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    test_support::wait_until(DEADLINE, "the producer to route with 4 shards", || {
        let grown = producer.routing().is_some_and(|r| r.shard_count == 4);
        async move { grown }
    })
    .await;
    test_support::wait_until(DEADLINE, "records on the new shards to be handled", || {
        let n = history.acked().iter().filter(|(shard, _)| *shard >= 2).count();
        async move { n >= 5 }
    })
    .await;
    let outcomes = publisher.stop().await;
    assert_eq!(outcomes.not_written + outcomes.unknown, 0, "{outcomes:?}");
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}
