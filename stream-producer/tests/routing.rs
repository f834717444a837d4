//! The routing-cache rules end to end: a real redis-server and the real coordinator (in-process, over HTTP).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{any_port, coordinator_config, stream, total_len, xlen, Env, DEADLINE};
use coord_server::server::CoordinatorHandle;
use protocol::routing::shard_for_key;
use protocol::{keys, RoutingVersion, ShardId};
use stream_producer::{FileVersionStore, MemoryVersionStore, Producer, PublishError, Record, WriteState};
use test_support::{wait_until, FaultProxy, Mode, RedisServer};

/// Short lease (refresh every 500 ms) so lease rules play out quickly.
const SHORT_LEASE: Duration = Duration::from_millis(1500);

/// A key that `shard_for_key` puts on `shard` with `count` shards.
fn key_on(shard: u32, count: u32) -> String {
    (0..)
        .map(|i| format!("key-{i}"))
        .find(|k| shard_for_key(k.as_bytes(), count) == ShardId(shard))
        .expect("some key maps to every shard")
}

#[tokio::test]
async fn producer_moves_to_the_new_shard_count_within_one_refresh_period() {
    let env = Env::start(4, SHORT_LEASE).await;
    let producer = env.producer().build().unwrap();
    let before = producer.ready().await.unwrap();
    assert_eq!((before.version, before.shard_count), (RoutingVersion(1), 4));

    env.add_shards(2).await;
    let added_at = Instant::now();
    wait_until(DEADLINE, "producer adopts 6 shards", || {
        let routing = producer.routing();
        async move { routing.is_some_and(|r| r.shard_count == 6) }
    })
    .await;
    // Refresh interval is lease / 3 = 500 ms; allow scheduling slack on a busy machine.
    assert!(
        added_at.elapsed() < Duration::from_millis(500) + Duration::from_millis(750),
        "picked up after {:?}",
        added_at.elapsed()
    );
    assert_eq!(producer.routing().unwrap().version, RoutingVersion(2));

    // Records of keys that now map to the new shards land on the new shards' stream keys.
    for shard in [4, 5] {
        let key = key_on(shard, 6);
        let published = producer.send(&key, &[("key", key.as_str())]).await.unwrap();
        assert_eq!(published.shard, ShardId(shard));
        assert_eq!(published.routing_version, RoutingVersion(2));
        assert_eq!(xlen(&env.redis, shard).await, 1, "shard {shard}");
    }
    producer.close().await.unwrap();
}

#[tokio::test]
async fn refresh_runs_periodically_while_publishing_succeeds() {
    let env = Env::start(2, SHORT_LEASE).await;
    let producer = env.producer().build().unwrap();
    producer.ready().await.unwrap();
    let start = producer.stats().refreshes;
    // Publish continuously over several refresh periods: the lease never runs out.
    let mut sent = 0u64;
    while producer.stats().refreshes < start + 4 {
        producer.send(sent.to_string(), &[("n", "1")]).await.unwrap();
        sent += 1;
        let remaining = producer
            .lease_remaining()
            .expect("lease valid while the coordinator answers");
        assert!(remaining <= SHORT_LEASE);
        // Real time: the publishing pace over refresh periods of the lease's clock.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(producer.stats().refresh_failures, 0);
    assert_eq!(total_len(&env.redis, 2).await, sent);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn newer_version_hint_refreshes_at_once() {
    // A long lease: the periodic refresh (10 s) is far away.
    let env = Env::start(4, Duration::from_secs(30)).await;
    let producer = env.producer().build().unwrap();
    producer.ready().await.unwrap();
    env.add_shards(1).await;
    assert_eq!(
        producer.routing().unwrap().shard_count,
        4,
        "not picked up on its own yet"
    );
    producer.observe_routing_version(RoutingVersion(2));
    // The next publish waits for the refresh instead of using 4 shards.
    let key = key_on(4, 5);
    let published = producer.send(&key, &[("f", "v")]).await.unwrap();
    assert_eq!(
        (published.shard, published.routing_version),
        (ShardId(4), RoutingVersion(2))
    );
    producer.close().await.unwrap();
}

/// Runs a coordinator behind a fault proxy, so a crash can also drop its open connections (a crashed process's
/// sockets close; an aborted in-process server's kept-alive connections would otherwise keep answering).
async fn coordinator_behind_proxy(env_redis_url: &str, lease: Duration) -> (CoordinatorHandle, FaultProxy) {
    let coordinator = CoordinatorHandle::spawn(coordinator_config(env_redis_url, lease, any_port()))
        .await
        .unwrap();
    let proxy = FaultProxy::start(coordinator.addr()).await;
    (coordinator, proxy)
}

#[tokio::test]
async fn lease_runs_out_during_a_coordinator_outage_then_fails_closed_and_recovers() {
    let env = Env::start(4, SHORT_LEASE).await;
    let (coordinator, proxy) = coordinator_behind_proxy(&env.redis.url(), SHORT_LEASE).await;
    let addr = coordinator.addr();
    let producer = common::isolated(Producer::builder(common::STREAM))
        .coordinator(format!("http://{}", proxy.addr()))
        .redis(env.redis.url())
        .build()
        .unwrap();
    producer.ready().await.unwrap();
    producer.send("before", &[("f", "v")]).await.unwrap();

    // Crash: the process is gone and its connections with it.
    coordinator.abort();
    proxy.set_mode(Mode::Reset);

    // The lease outlives the outage for a while: publishes keep working on the cached routing...
    wait_until(DEADLINE, "a refresh failed", || {
        let failures = producer.stats().refresh_failures;
        async move { failures > 0 }
    })
    .await;
    // The first failure comes at the refresh point (a third into the lease): most of the lease is left.
    assert!(
        producer.lease_remaining().is_some(),
        "cache kept while the lease is valid"
    );
    producer.send("during", &[("f", "v")]).await.unwrap();

    // ...then fail closed with the typed error, writing nothing.
    let err = wait_for_routing_expired(&producer).await;
    assert!(
        matches!(
            err,
            PublishError::RoutingExpired {
                version: RoutingVersion(1),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.write_state(), WriteState::NotWritten);
    let written_before = total_len(&env.redis, 4).await;
    for i in 0..50 {
        let e = producer.send(format!("k{i}"), &[("f", "v")]).await.unwrap_err();
        assert!(e.is_routing_unavailable(), "{e:?}");
    }
    let e = producer
        .send_batch(
            (0..50)
                .map(|i| Record::with_key(format!("b{i}")).field("f", "v"))
                .collect(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.count(WriteState::NotWritten), 50);
    let queued = producer.enqueue(Record::with_key("q").field("f", "v")).await.unwrap();
    assert!(queued.await.unwrap_err().is_routing_unavailable());
    assert_eq!(
        total_len(&env.redis, 4).await,
        written_before,
        "nothing written without a valid routing"
    );
    assert!(producer.stats().routing_refusals >= 52);

    // A new coordinator comes up at the same address, on the same Redis: the producer recovers on its own.
    let restarted = spawn_at(&env.redis.url(), addr).await;
    proxy.set_mode(Mode::Pass);
    wait_until(DEADLINE, "routing valid again", || {
        let routing = producer.routing();
        async move { routing.is_some() }
    })
    .await;
    producer.send("after", &[("f", "v")]).await.unwrap();
    producer.close().await.unwrap();
    restarted.shutdown().await;
}

async fn wait_for_routing_expired(producer: &Producer) -> PublishError {
    let expired = test_support::poll_for(DEADLINE, || async {
        match producer.send("probe", &[("f", "v")]).await {
            Err(e) if e.is_routing_unavailable() => Some(e),
            Err(e) => panic!("unexpected error while waiting for the lease to end: {e:?}"),
            Ok(_) => None,
        }
    })
    .await;
    expired.expect("the lease never ran out")
}

/// Starts a coordinator on `addr` (the port of one that was aborted), retrying while the port is still taken.
async fn spawn_at(redis_url: &str, addr: std::net::SocketAddr) -> CoordinatorHandle {
    let spawn = || CoordinatorHandle::spawn(coordinator_config(redis_url, SHORT_LEASE, addr));
    let spawned = test_support::poll_every(Duration::from_millis(50), DEADLINE, || async { spawn().await.ok() }).await;
    match spawned {
        Some(c) => c,
        // Still taken at the deadline: this last try's error says why.
        None => spawn()
            .await
            .unwrap_or_else(|e| panic!("cannot restart the coordinator on {addr}: {e}")),
    }
}

#[tokio::test]
async fn second_coordinator_url_takes_over_when_the_first_is_gone() {
    let env = Env::start(4, SHORT_LEASE).await;
    let dead = format!("http://127.0.0.1:{}", test_support::free_port());
    let producer = common::isolated(Producer::builder(common::STREAM))
        .coordinator(dead)
        .coordinator(env.coordinator.url())
        .redis(env.redis.url())
        .build()
        .unwrap();
    producer.send("k", &[("f", "v")]).await.unwrap();
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_routing_rollback_is_restored_upwards_from_the_entries_redis_kept() {
    let mut env = Env::start_persistent(4, SHORT_LEASE).await;
    let routing_key = keys::stream_routing(&stream());
    let v1 = env.redis.snapshot_keys(&routing_key).await;
    assert_eq!(v1.len(), 1);
    let producer = env.producer().build().unwrap();
    producer.ready().await.unwrap();
    env.add_shards(2).await;
    wait_until(DEADLINE, "producer at version 2", || {
        let routing = producer.routing();
        async move { routing.is_some_and(|r| r.version == RoutingVersion(2)) }
    })
    .await;
    // The producer writes into both new shards.
    for s in [4, 5] {
        producer.send(&key_on(s, 6), &[("f", "v")]).await.unwrap();
    }

    // An operator restores the coordinator's keys from an older backup: the routing key goes back to version 1
    // (4 shards) and the seals and the new shards' records are gone; the shard streams keep what producers wrote.
    // Those entries are Redis's evidence of the growth (the producer's memory is not: a report is never believed).
    env.redis.restore_snapshot(&v1).await;
    let mut con = env.redis.connection().await;
    for s in 0..6 {
        let _: u64 = redis::cmd("DEL")
            .arg(keys::shard_fence(&stream(), ShardId(s)))
            .query_async(&mut con)
            .await
            .expect("DEL fence");
    }
    // A failover promotes another server: the same data (as lost), another run id.
    drop(con);
    env.redis.restart().await;
    // The producer's next refresh reports version 2 and 6 shards: the coordinator probes Redis, finds entries in
    // shards 4 and 5 and restores the growth under a version it never issued (2 may have been seen with another
    // meaning), and the producer adopts it.
    wait_until(DEADLINE, "the growth is restored under a new version", || {
        let routing = producer.routing();
        async move { routing.is_some_and(|r| r.version > RoutingVersion(2)) }
    })
    .await;
    let stats = producer.stats();
    assert_eq!(stats.shard_count, Some(6), "never the lower stored count: {stats:?}");
    assert_eq!(stats.routing_rollbacks, 0, "{stats:?}");
    let stored = env.coordinator.coordinator().describe_routing(&stream()).await.unwrap();
    assert_eq!(stored.shard_count, 6);
    assert!(stored.shard_records, "the restored shards have their records again");

    // A key of shard 5 (of 6) stays on shard 5, at the restored version.
    let key = key_on(5, 6);
    // (The connections the restart broke may fail the first sends: not written.)
    let published = test_support::wait_for(DEADLINE, "a send after the restart", || async {
        producer.send(&key, &[("f", "v")]).await.ok()
    })
    .await;
    assert_eq!(published.shard, ShardId(5));
    assert_eq!(published.routing_version, stored.routing_version);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn highest_observed_version_survives_a_producer_restart_through_the_version_store() {
    let mut env = Env::start_persistent(4, SHORT_LEASE).await;
    let dir = tempfile::tempdir().unwrap();
    let routing_key = keys::stream_routing(&stream());
    let v1 = env.redis.snapshot_keys(&routing_key).await;
    env.add_shards(1).await;

    let first = env
        .producer()
        .version_store(FileVersionStore::new(dir.path()).unwrap())
        .build()
        .unwrap();
    assert_eq!(first.ready().await.unwrap().version, RoutingVersion(2));
    first.close().await.unwrap();

    // Redis loses the growth and everything after it: the routing, the seals and the new shard's record. Only the
    // version store remembers it (version 2, 5 shards).
    env.redis.restore_snapshot(&v1).await;
    let mut con = env.redis.connection().await;
    for s in 0..5 {
        let _: u64 = redis::cmd("DEL")
            .arg(keys::shard_fence(&stream(), ShardId(s)))
            .query_async(&mut con)
            .await
            .expect("DEL fence");
    }
    // A failover promotes another server: the same data (as lost), another run id.
    drop(con);
    env.redis.restart().await;
    let second = Arc::new(
        env.producer()
            .version_store(FileVersionStore::new(dir.path()).unwrap())
            .build()
            .unwrap(),
    );
    // The first refresh reports version 2 and 5 shards from the version store. Nothing in Redis tells of that
    // growth, and a report is never evidence: the stored routing is answered (and adopted, counted as a rollback).
    let routing = second.ready().await.unwrap();
    assert_eq!(routing.shard_count, 4, "a report alone grows nothing: {routing:?}");
    let stored = env.coordinator.coordinator().describe_routing(&stream()).await.unwrap();
    // (The tick may have retired the version after the restart, or written the lost records of shards 0-3 again:
    // the count is what matters.)
    assert_eq!(stored.shard_count, 4);
    assert!(
        second.stats().max_observed_version >= RoutingVersion(2),
        "the version store keeps it (or the version the tick retired it to)"
    );

    // A plain producer that still routes by the lost layout writes into shard 4: now Redis holds evidence of the
    // growth. The second producer's next refresh (it still reports 5 shards) restores it, under a version above 2.
    let mut con = env.redis.connection().await;
    let _: String = redis::cmd("XADD")
        .arg(keys::shard_stream(&stream(), ShardId(4)))
        .arg("*")
        .arg("f")
        .arg("v")
        .query_async(&mut con)
        .await
        .expect("XADD");
    wait_until(DEADLINE, "the growth is restored from the entries", || {
        let routing = second.routing();
        async move { routing.is_some_and(|r| r.shard_count == 5) }
    })
    .await;
    let routing = second.routing().unwrap();
    assert!(routing.version > RoutingVersion(2), "{routing:?}");
    assert_eq!(second.stats().max_observed_version, routing.version);
    Arc::into_inner(second).unwrap().close().await.unwrap();
}

#[tokio::test]
async fn a_newer_routing_seen_by_another_producer_of_the_store_refreshes_at_once() {
    // A long lease: the periodic refresh (10 s) is far away.
    let env = Env::start(4, Duration::from_secs(30)).await;
    // One memory shared by both producers (what the default, process-wide store does for a whole process).
    let shared = MemoryVersionStore::new();
    let first = env.producer().version_store(shared.clone()).build().unwrap();
    let second = env.producer().version_store(shared).build().unwrap();
    first.ready().await.unwrap();
    second.ready().await.unwrap();
    env.add_shards(1).await;
    first.observe_routing_version(RoutingVersion(2));
    wait_until(DEADLINE, "the first producer adopts 5 shards", || {
        let routing = first.routing();
        async move { routing.is_some_and(|r| r.shard_count == 5) }
    })
    .await;
    assert_eq!(second.routing().unwrap().shard_count, 4, "no refresh of its own yet");
    // The second producer's next publish sees that its routing is stale and refreshes first.
    let key = key_on(4, 5);
    let published = second.send(&key, &[("f", "v")]).await.unwrap();
    assert_eq!(
        (published.shard, published.routing_version),
        (ShardId(4), RoutingVersion(2))
    );
    first.close().await.unwrap();
    second.close().await.unwrap();
}

#[tokio::test]
async fn a_routing_hash_with_an_unknown_layout_fails_closed() {
    let env = Env::start(2, SHORT_LEASE).await;
    let producer = env.producer().build().unwrap();
    producer.ready().await.unwrap();
    // A routing hash written by a build with another layout: this coordinator must not interpret it.
    let mut con = env.redis.connection().await;
    let _: i64 = redis::cmd("HSET")
        .arg(keys::stream_routing(&stream()))
        .arg(keys::fields::LAYOUT_VERSION)
        .arg(99)
        .query_async(&mut con)
        .await
        .unwrap();
    let refused = test_support::poll_for(DEADLINE, || async {
        let sent = producer.send("k", &[("f", "v")]).await;
        if sent.is_ok() {
            assert!(
                producer.stats().refreshes < 20,
                "the routing is still served: {:?}",
                producer.stats()
            );
        }
        sent.err()
    })
    .await;
    let err = refused.expect("the routing is still served");
    assert!(matches!(err, PublishError::RoutingExpired { .. }), "{err:?}");
    assert_eq!(err.write_state(), WriteState::NotWritten);
    let cause = std::error::Error::source(&err)
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(cause.contains("layoutVersion"), "{cause}");
}

#[tokio::test]
async fn a_redis_without_a_command_the_producer_sends_is_refused_naming_it_and_the_url_without_password() {
    let env = Env::start(2, SHORT_LEASE).await;
    // The producer's own Redis has XADD renamed away (the coordinator's Redis is complete).
    let crippled = RedisServer::builder().rename_command("XADD", "").start().await;
    let url = format!("redis://default:s3cret@127.0.0.1:{}", crippled.port());
    let producer = env.producer().redis(url).build().unwrap();
    let err = producer.ready().await.expect_err("XADD is missing");
    assert!(matches!(err, PublishError::RedisUnsupported { .. }), "{err:?}");
    let message = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(message.contains("XADD (publishing)"), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{}", crippled.port())), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
    let publish = producer.send("k", &[("f", "v")]).await.unwrap_err();
    assert!(matches!(publish, PublishError::RedisUnsupported { .. }), "{publish:?}");
    assert_eq!(publish.write_state(), WriteState::NotWritten);
    assert!(!publish.is_retryable());
    producer.close().await.unwrap();
}
