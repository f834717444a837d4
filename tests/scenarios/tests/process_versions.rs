//! The highest observed version belongs to the process, not to one client object (Korean seed: "Consumer와
//! producer는 현재 process lifetime 동안 관측한 최고 version을 기억한다"): a consumer or producer recreated in the
//! same process after a Redis rollback still reports what its predecessor saw, so the coordinator detects the
//! rollback; and what one client of the process observes about the routing reaches the producer at once.
//!
//! These tests use the SDKs' default version store (the process-wide memory). Each scenario has its own stream
//! and group names, so tests sharing a process (`cargo test`) do not see each other's versions.

mod common;

use common::*;
use protocol::routing::shard_for_key;
use protocol::{keys, RoutingVersion, ShardId};
use scenario_tests::History;
use std::sync::atomic::Ordering;
use std::time::Duration;
use stream_producer::Producer;
use test_support::{wait_for, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_recreated_in_the_same_process_after_a_rollback_reports_its_predecessors_version() {
    let s = Scenario::start("procconsumer", 2).await;
    let history = History::new();
    let a = s.spawn_consumer("a", &history);
    wait_status(&a, DEADLINE, "a reads both shards", |st| st.reading.len() == 2).await;
    let snap = s.redis.snapshot_keys(&s.group_state_pattern()).await;
    let before = s.describe().await.metadata_version;

    // Version N: b joins and takes a shard; a observes N.
    let b = s.spawn_consumer("b", &history);
    wait_status(&b, DEADLINE, "b reads one", |st| st.reading.len() == 1).await;
    let n = s.describe().await.metadata_version;
    assert!(n > before);
    wait_status(&a, DEADLINE, "a observed N", |st| st.max_observed_version >= n).await;
    a.abort().await;
    b.abort().await;

    // Redis falls back; the process recreates its consumer (same member id, new object).
    s.redis.restore_snapshot(&snap).await;
    let ahead_before = s.coordinator().stats().client_version_ahead.load(Ordering::Relaxed);
    let again = s.spawn_consumer("a", &history);
    let st = wait_status(&again, DEADLINE, "the recreated consumer's first answer", |st| {
        st.heartbeats.answers() + st.heartbeats.failed > 0
    })
    .await;
    assert!(st.max_observed_version >= n, "loaded from the process memory: {st:?}");
    let ahead = s.coordinator().stats().client_version_ahead.load(Ordering::Relaxed);
    assert!(
        ahead > ahead_before,
        "the coordinator saw a client version above the stored one ({ahead_before} -> {ahead})"
    );
    wait_status(&again, DEADLINE, "OK again past N", |st| {
        st.last_status == Some(protocol::Status::Ok) && st.metadata_version > n
    })
    .await;
    again.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_recreated_in_the_same_process_after_a_routing_rollback_gets_the_growth_restored() {
    let mut s = Scenario::on(
        RedisServer::builder().persistence(true).start().await,
        "procproducer",
        2,
    )
    .await;
    let routing_key = keys::stream_routing(&s.stream);
    let snap = s.redis.snapshot_keys(&routing_key).await;
    assert_eq!(snap.len(), 1, "the routing hash is in the snapshot");

    let first = s.producer().build().unwrap();
    first.ready().await.unwrap();
    s.coordinator().add_shards(&s.stream, 1, None).await.unwrap();
    first.observe_routing_version(RoutingVersion(2));
    wait_for_routing(&first, RoutingVersion(2)).await;
    first.close().await.unwrap();

    // The add-shards write is lost from the routing hash; the process builds a new producer. Its first refresh
    // reports version 2 with 3 shards (the process's version store): the coordinator restores the growth
    // (issue 30: corrected upwards, never by adopting the lower stored value) under a version it never issued.
    s.redis.restore_snapshot(&snap).await;
    // As a failover would: another server (run id) with the data as lost.
    s.redis.restart().await;
    wait_for(DEADLINE, "the coordinator to reach the restarted Redis", || async {
        s.coordinator().describe_routing(&s.stream).await.ok()
    })
    .await;
    let second = s.producer().build().unwrap();
    let routing = second.ready().await.unwrap();
    assert_eq!(routing.shard_count, 3, "the growth is restored");
    assert!(
        routing.version > RoutingVersion(2),
        "under a retired number: {routing:?}"
    );
    let stats = second.stats();
    assert_eq!(stats.routing_rollbacks, 0, "nothing went back: {stats:?}");
    let stored = s.coordinator().describe_routing(&s.stream).await.unwrap();
    assert_eq!((stored.shard_count, stored.routing_version), (3, routing.version));
    second.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumers_heartbeat_answer_with_a_newer_routing_makes_the_producer_of_the_process_refresh_at_once() {
    let mut s = Scenario::start("prochint", 2).await;
    // A producer on a coordinator with a long routing lease: its periodic refresh (10 s) is far away.
    let long = s
        .add_coordinator_with(|c| c.routing_lease = Duration::from_secs(30))
        .await;
    let producer = Producer::builder(s.stream.as_str())
        .coordinator(s.urls()[long].clone())
        .redis(s.redis.url())
        .build()
        .unwrap();
    assert_eq!(producer.ready().await.unwrap().shard_count, 2);
    let history = History::new();
    let a = s.spawn_consumer("a", &history);
    wait_status(&a, DEADLINE, "a reads both shards", |st| st.reading.len() == 2).await;

    s.coordinator().add_shards(&s.stream, 1, None).await.unwrap();
    // The group adopts the new routing; a's next heartbeat answer carries routing version 2 and the new shard.
    wait_status(&a, DEADLINE, "a reads three shards", |st| st.reading.len() == 3).await;
    assert_eq!(producer.routing().unwrap().shard_count, 2, "no refresh of its own yet");
    let key = (0..)
        .map(|i| format!("key-{i}"))
        .find(|k| shard_for_key(k.as_bytes(), 3) == ShardId(2))
        .unwrap();
    let published = producer.send(&key, &[("key", key.as_str())]).await.unwrap();
    assert_eq!(
        (published.shard, published.routing_version),
        (ShardId(2), RoutingVersion(2))
    );
    producer.close().await.unwrap();
    a.close().await.unwrap();
}

async fn wait_for_routing(producer: &Producer, version: RoutingVersion) {
    test_support::wait_until(DEADLINE, "the producer to adopt the new routing", || {
        let current = producer.routing().map(|r| r.version);
        async move { current == Some(version) }
    })
    .await;
}
