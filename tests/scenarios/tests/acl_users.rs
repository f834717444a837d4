//! Issue 33, item 1: the users of `deploy/redis/users.acl` run the real SDKs. Every producer mode (plain, fenced,
//! idempotent, durable) publishes as the user the README names for it, and a consumer joins through a
//! coordinator (itself running as the `coordinator` user) and reads and acknowledges everything, on one Redis and
//! on a Redis Cluster whose nodes all loaded the file; Redis's `ACL LOG` stays empty (no SDK command was
//! refused). A producer whose user lacks a permission it needs fails at start with
//! [`RedisCheckError::NotPermitted`] naming the command and key.

mod common;

use std::time::{Duration, Instant};

use client_core::RedisCheckError;
use common::*;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::ShardId;
use scenario_tests::History;
use stream_producer::{Durability, Producer, PublishError};
use test_support::cluster::RedisCluster;
use test_support::RedisServer;

const SHARDS: u32 = 4;
const RECORDS: u64 = 30;
const KEYS: u64 = 8;
const GROUP: &str = "billing";

/// A producer mode and the shipped user that runs it.
#[derive(Debug, Clone, Copy)]
struct Mode {
    name: &'static str,
    user: &'static str,
    fencing: bool,
    idempotent: bool,
    durable: bool,
}

const fn mode(name: &'static str, user: &'static str, fencing: bool, idempotent: bool, durable: bool) -> Mode {
    Mode {
        name,
        user,
        fencing,
        idempotent,
        durable,
    }
}

/// One server: the checked transaction needs no script, so only the idempotent producer needs the scripted user.
const ONE_SERVER: [Mode; 4] = [
    mode("plain", "producer-tenant-a", false, false, false),
    mode("fenced", "producer-tenant-a", true, false, false),
    mode("durable", "producer-tenant-a", true, false, true),
    mode("idempotent", "producer-scripted-tenant-a", true, true, false),
];

/// A Redis Cluster: the fenced producer checks the fence with the publish script there.
const CLUSTER: [Mode; 4] = [
    mode("plain", "producer-tenant-a", false, false, false),
    mode("fenced", "producer-scripted-tenant-a", true, false, false),
    mode("durable", "producer-scripted-tenant-a", true, false, true),
    mode("idempotent", "producer-scripted-tenant-a", true, true, false),
];

fn producer(coord: &Coord, redis: String, m: Mode) -> Producer {
    let mut b = Producer::builder(TENANT_A)
        .coordinator(coord.url())
        .redis(redis)
        .fencing(m.fencing)
        .idempotence(m.idempotent)
        .coordinator_timeout(Duration::from_millis(400))
        .refresh_retry(Duration::from_millis(20), Duration::from_millis(200));
    if m.durable {
        b = b.durability(Durability::replicas(1, Duration::from_secs(2)));
    }
    b.build().expect("valid producer configuration")
}

async fn create_group(coord: &Coord) -> (StreamName, GroupName) {
    let stream = StreamName::new(TENANT_A).unwrap();
    let group = GroupName::new(GROUP).unwrap();
    coord
        .coordinator()
        .create_group(
            &stream,
            &group,
            &CreateGroupRequest {
                shard_count: Some(SHARDS),
                timings: Some(timings()),
            },
        )
        .await
        .expect("group created as the coordinator user");
    (stream, group)
}

/// Publishes `RECORDS` records in every mode, each producer as its user (`redis_as(user)` is its Redis URL),
/// then reads them all with one consumer as `consumer-tenant-a`.
async fn every_mode_then_consume(coord: &Coord, modes: &[Mode], redis_as: impl Fn(&str) -> String) -> History {
    let (stream, group) = create_group(coord).await;
    let history = History::new();
    for (i, m) in modes.iter().enumerate() {
        let p = producer(coord, redis_as(m.user), *m);
        p.ready()
            .await
            .unwrap_or_else(|e| panic!("the {} producer starts as {}: {e}", m.name, m.user));
        let from = i as u64 * RECORDS;
        let written = publish(&p, &history, from, RECORDS, KEYS).await;
        assert_eq!(
            written, RECORDS,
            "the {} producer as {} wrote every record",
            m.name, m.user
        );
        p.close().await.expect("producer closes");
    }
    let builder = consumer_builder(&stream, &group, "a", vec![coord.url()], redis_as("consumer-tenant-a"));
    let consumer = Scenario::spawn_with(builder, "a", &history, &Gate::open());
    wait_status(&consumer, DEADLINE, "the consumer to read every shard", |st| {
        st.reading.len() == SHARDS as usize
    })
    .await;
    wait_all_handled(&history, DEADLINE).await;
    let report = consumer.close().await.expect("the consumer closes");
    assert!(report.killed_shards.is_empty(), "{report:?}");
    history.assert_holds();
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sdk_mode_runs_as_its_shipped_user_on_one_server() {
    init_tracing();
    let started = Instant::now();
    let acl = acl_file(&records_dir("acl-one-server"), &[]);
    let redis = RedisServer::builder().aclfile(&acl).start().await;
    // The durable producer waits for one replica.
    let _replica = RedisServer::builder().aclfile(&acl).replica_of(&redis).start().await;
    let coord = Coord::start(&user_url(redis.port(), "coordinator")).await;

    let history = every_mode_then_consume(&coord, &ONE_SERVER, |user| user_url(redis.port(), user)).await;

    let stream = StreamName::new(TENANT_A).unwrap();
    let keys = (0..SHARDS).map(|s| protocol::keys::shard_stream(&stream, ShardId(s)));
    assert_eq!(
        test_support::pending_total(&redis, keys, GROUP).await,
        0,
        "every record acknowledged"
    );
    assert_eq!(history.publishes().len() as u64, RECORDS * ONE_SERVER.len() as u64);
    let refused = acl_refusals(&redis).await;
    assert!(refused.is_empty(), "Redis refused SDK commands: {refused:#?}");
    println!(
        "one server: 4 modes and a consumer as their users in {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sdk_mode_runs_as_its_shipped_user_on_a_cluster() {
    init_tracing();
    let started = Instant::now();
    let acl = acl_file(&records_dir("acl-cluster"), &[]);
    // Replicas: the durable producer waits for one.
    let cluster = RedisCluster::builder().replicas(true).aclfile(&acl).start().await;
    let coord = Coord::start(&cluster_target(&cluster, "coordinator")).await;

    every_mode_then_consume(&coord, &CLUSTER, |user| cluster_target(&cluster, user)).await;

    for node in cluster.nodes() {
        let refused = acl_refusals(node.server()).await;
        assert!(
            refused.is_empty(),
            "node {} refused SDK commands: {refused:#?}",
            node.port()
        );
    }
    // The fenced producer's user without scripts is told at start what it lacks on a cluster.
    let unscripted = mode("fenced", "producer-tenant-a", true, false, false);
    let refused = not_permitted(&coord, cluster_target(&cluster, unscripted.user), unscripted).await;
    assert!(refused.iter().any(|r| r.starts_with("SCRIPT LOAD")), "{refused:#?}");
    assert!(refused.iter().any(|r| r.starts_with("EVALSHA")), "{refused:#?}");
    println!(
        "cluster: 4 modes and a consumer as their users in {:?}",
        started.elapsed()
    );
}

/// Starts a producer in mode `m` on `redis` and returns what its start-up check says the ACL refused.
async fn not_permitted(coord: &Coord, redis: String, m: Mode) -> Vec<String> {
    let p = producer(coord, redis, m);
    let err = p.ready().await.expect_err("the user lacks a permission");
    let message = err.to_string();
    let PublishError::RedisUnsupported { source } = &err else {
        panic!("expected RedisUnsupported, got {err:?}");
    };
    let RedisCheckError::NotPermitted { refused, url } = source.as_ref() else {
        panic!("expected NotPermitted, got {source:?}");
    };
    assert!(!url.contains("change-me"), "the password is not shown: {url}");
    for r in refused {
        assert!(message.contains(r.as_str()), "{message}");
        assert!(r.contains("NOPERM"), "{r}");
    }
    refused.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_whose_user_lacks_a_permission_fails_at_start_naming_it() {
    init_tracing();
    let extra = [
        variant_of("producer-tenant-a", "producer-nowatch-tenant-a", "-watch"),
        variant_of("producer-tenant-a", "producer-nowait-tenant-a", "-wait"),
    ];
    let acl = acl_file(&records_dir("acl-missing"), &extra);
    let redis = RedisServer::builder().aclfile(&acl).start().await;
    let coord = Coord::start(&user_url(redis.port(), "coordinator")).await;
    create_group(&coord).await;
    let stream = StreamName::new(TENANT_A).unwrap();
    let fence = protocol::keys::shard_fence(&stream, ShardId(0));
    let shard = protocol::keys::shard_stream(&stream, ShardId(0));
    let as_user = |user: &str| user_url(redis.port(), user);

    let fenced = mode("fenced", "producer-nowatch-tenant-a", true, false, false);
    let refused = not_permitted(&coord, as_user(fenced.user), fenced).await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(
        refused[0].starts_with(&format!("WATCH {fence} (NOPERM")),
        "{refused:#?}"
    );

    let durable = mode("durable", "producer-nowait-tenant-a", true, false, true);
    let refused = not_permitted(&coord, as_user(durable.user), durable).await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(refused[0].starts_with("WAIT (NOPERM"), "{refused:#?}");

    // The idempotent producer as the user without scripts.
    let idempotent = mode("idempotent", "producer-tenant-a", true, true, false);
    let refused = not_permitted(&coord, as_user(idempotent.user), idempotent).await;
    for needed in ["SCRIPT LOAD", "EVALSHA", "TYPE", "HSET", "PEXPIRE"] {
        assert!(refused.iter().any(|r| r.starts_with(needed)), "{needed}: {refused:#?}");
    }

    // A producer given the consumer's user: it may not write the shards.
    let plain = mode("plain", "consumer-tenant-a", false, false, false);
    let refused = not_permitted(&coord, as_user(plain.user), plain).await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(refused[0].starts_with(&format!("XADD {shard} (NOPERM")), "{refused:#?}");

    // The probes wrote nothing.
    let mut admin = redis.connection().await;
    let exists: i64 = redis::cmd("EXISTS").arg(&shard).query_async(&mut admin).await.unwrap();
    assert_eq!(exists, 0, "no probe created the shard stream");
}
