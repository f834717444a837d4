//! The seal script and the drain observation against a real `redis-server`: the fence is set (never lowered),
//! the seal position is the last entry at that instant, atomically with concurrent fenced writers; add-shards
//! seals every parent and records the positions in the routing.

use coord_server::store::reshard::{drain_state, seal};
use coord_server::{Config, Coordinator};
use protocol::keys::{self, shard_fence_fields};
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::reshard::EntryId;
use protocol::{RoutingVersion, ShardId};
use redis::AsyncCommands;
use test_support::RedisServer;

/// A writer as the fenced publish script behaves: refused when the shard's fence is above its routing version.
/// Each entry records the version its writer held.
const FENCED_XADD: &str = r#"
local fence = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if fence > tonumber(ARGV[1]) then return false end
return redis.call('XADD', KEYS[1], '*', 'v', ARGV[1])
"#;

fn stream() -> StreamName {
    StreamName::new("orders").unwrap()
}

async fn fence_of(conn: &mut redis::aio::MultiplexedConnection, shard: u32) -> Option<String> {
    conn.hget(
        keys::shard_fence(&stream(), ShardId(shard)),
        shard_fence_fields::ROUTING_VERSION,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn seal_sets_the_fence_and_answers_the_last_entry() {
    let redis = RedisServer::start().await;
    let mut cm = redis.connection_manager().await;
    let mut conn = redis.connection().await;
    // An empty (missing) shard seals at 0-0.
    let s = seal(&mut cm, &stream(), ShardId(0), RoutingVersion(2), 4)
        .await
        .unwrap();
    assert_eq!((s.position, s.fence_before), (EntryId::ZERO, RoutingVersion(0)));
    assert_eq!(fence_of(&mut conn, 0).await.as_deref(), Some("2"));

    let key = keys::shard_stream(&stream(), ShardId(1));
    let _: String = conn.xadd(&key, "5-1", &[("k", "a")]).await.unwrap();
    let _: String = conn.xadd(&key, "7-3", &[("k", "b")]).await.unwrap();
    let s = seal(&mut cm, &stream(), ShardId(1), RoutingVersion(3), 4)
        .await
        .unwrap();
    assert_eq!(s.position, EntryId { ms: 7, seq: 3 });
    // A deleted last entry still counts: the position is the last id generated, not the last one left.
    let _: i64 = conn.xdel(&key, &["7-3"]).await.unwrap();
    let again = seal(&mut cm, &stream(), ShardId(1), RoutingVersion(2), 4)
        .await
        .unwrap();
    assert_eq!(again.position, EntryId { ms: 7, seq: 3 });
    assert_eq!(again.fence_before, RoutingVersion(3));
    assert_eq!(
        fence_of(&mut conn, 1).await.as_deref(),
        Some("3"),
        "an older seal never lowers the fence"
    );
}

#[tokio::test]
async fn a_corrupt_fence_is_refused_and_left_as_it_was() {
    let redis = RedisServer::start().await;
    let mut cm = redis.connection_manager().await;
    let mut conn = redis.connection().await;
    let fence = keys::shard_fence(&stream(), ShardId(0));
    let _: () = conn
        .hset(&fence, shard_fence_fields::ROUTING_VERSION, "2x")
        .await
        .unwrap();
    let err = seal(&mut cm, &stream(), ShardId(0), RoutingVersion(3), 4)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("CORRUPT"), "{err}");
    assert_eq!(fence_of(&mut conn, 0).await.as_deref(), Some("2x"));
}

#[tokio::test]
async fn every_entry_after_the_seal_was_written_with_the_new_routing() {
    let redis = RedisServer::start().await;
    let mut cm = redis.connection_manager().await;
    let key = keys::shard_stream(&stream(), ShardId(0));
    let fence = keys::shard_fence(&stream(), ShardId(0));
    let script = redis::Script::new(FENCED_XADD);
    let mut writers = Vec::new();
    for version in ["1", "1", "2"] {
        let (mut c, script, key, fence) = (redis.connection().await, script.clone(), key.clone(), fence.clone());
        writers.push(tokio::spawn(async move {
            let mut written = 0u32;
            for _ in 0..3_000 {
                let id: Option<String> = script
                    .key(&key)
                    .key(&fence)
                    .arg(version)
                    .arg(shard_fence_fields::ROUTING_VERSION)
                    .invoke_async(&mut c)
                    .await
                    .unwrap();
                written += u32::from(id.is_some());
            }
            written
        }));
    }
    // Seal while the writers run.
    let mut conn = redis.connection().await;
    test_support::wait_until(std::time::Duration::from_secs(10), "some entries", || {
        let mut conn = conn.clone();
        let key = key.clone();
        async move { conn.xlen::<_, u64>(&key).await.unwrap() > 500 }
    })
    .await;
    let s = seal(&mut cm, &stream(), ShardId(0), RoutingVersion(2), 4)
        .await
        .unwrap();
    for w in writers {
        w.await.unwrap();
    }
    let entries: redis::streams::StreamRangeReply = conn.xrange_all(&key).await.unwrap();
    let (mut before, mut after, mut stale_after) = (0, 0, 0);
    for e in &entries.ids {
        let id: EntryId = e.id.parse().unwrap();
        let v: String = e.get("v").unwrap();
        if id <= s.position {
            before += 1;
        } else {
            after += 1;
            stale_after += u32::from(v == "1");
        }
    }
    assert!(
        before > 0 && after > 0,
        "the seal fell inside the load: {before} before, {after} after"
    );
    assert_eq!(stale_after, 0, "a stale writer wrote after the seal");
}

#[tokio::test]
async fn drain_state_sees_delivery_and_acknowledgement_up_to_the_seal() {
    let redis = RedisServer::start().await;
    let mut cm = redis.connection_manager().await;
    let mut conn = redis.connection().await;
    let group = GroupName::new("billing").unwrap();
    let key = keys::shard_stream(&stream(), ShardId(0));
    for i in 1..=3 {
        let _: String = conn.xadd(&key, format!("{i}-0"), &[("k", "a")]).await.unwrap();
    }
    let s = seal(&mut cm, &stream(), ShardId(0), RoutingVersion(2), 4)
        .await
        .unwrap();
    assert_eq!(s.position, EntryId { ms: 3, seq: 0 });
    let _: String = conn.xadd(&key, "4-0", &[("k", "new")]).await.unwrap();
    let st = stream();
    let state = || {
        let (mut cm, st, group) = (cm.clone(), st.clone(), group.clone());
        async move { drain_state(&mut cm, &st, &group, ShardId(0), s.position).await }
    };
    let d = state().await.unwrap();
    assert_eq!((d.fence, d.last_delivered), (RoutingVersion(2), None));
    assert!(!d.drained(s.position), "no Redis group yet");
    let _: () = conn.xgroup_create(&key, group.as_str(), "0").await.unwrap();
    let read: redis::streams::StreamReadReply = conn
        .xread_options(
            &[&key],
            &[">"],
            &redis::streams::StreamReadOptions::default()
                .group(group.as_str(), "c")
                .count(3),
        )
        .await
        .unwrap();
    assert_eq!(read.keys[0].ids.len(), 3);
    let d = state().await.unwrap();
    assert_eq!(d.last_delivered, Some(EntryId { ms: 3, seq: 0 }));
    assert!(!d.drained(s.position), "delivered, not acknowledged");
    let _: i64 = conn.xack(&key, group.as_str(), &["1-0", "2-0"]).await.unwrap();
    assert!(!state().await.unwrap().drained(s.position));
    let _: i64 = conn.xack(&key, group.as_str(), &["3-0"]).await.unwrap();
    assert!(state().await.unwrap().drained(s.position));
}

#[tokio::test]
async fn add_shards_seals_every_parent_and_records_the_positions() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let coordinator = Coordinator::connect(Config::new(redis.url())).await.unwrap();
    coordinator
        .create_group(
            &stream(),
            &GroupName::new("g").unwrap(),
            &CreateGroupRequest {
                shard_count: Some(2),
                timings: None,
            },
        )
        .await
        .unwrap();
    let _: String = conn
        .xadd(keys::shard_stream(&stream(), ShardId(1)), "9-9", &[("k", "a")])
        .await
        .unwrap();
    let d = coordinator.add_shards(&stream(), 2, None).await.unwrap();
    assert_eq!(d.shard_count, 4);
    for shard in 0..2 {
        assert_eq!(fence_of(&mut conn, shard).await.as_deref(), Some("2"), "parent {shard}");
    }
    for shard in 2..4 {
        assert_eq!(fence_of(&mut conn, shard).await, None, "a child has no fence");
    }
    let (_, json) = coordinator.store().read_routing(&stream()).await.unwrap().unwrap();
    let routing = protocol::metadata::StreamRouting::decode(&json).unwrap();
    let g = &routing.growths[0];
    assert_eq!((g.parents, g.shard_count), (2, 4));
    assert_eq!(g.seals[&ShardId(0)], EntryId::ZERO);
    assert_eq!(g.seals[&ShardId(1)], EntryId { ms: 9, seq: 9 });
}

#[tokio::test]
async fn an_add_shards_whose_seal_fails_commits_nothing_and_its_retry_grows_the_stream() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let coordinator = coordinator_with(&redis, 2).await;
    let routing = || async {
        let (_, json) = coordinator.store().read_routing(&stream()).await.unwrap().unwrap();
        protocol::metadata::StreamRouting::decode(&json).unwrap()
    };
    // A fence the seal script refuses: the parents are sealed before the routing is committed, so add-shards
    // fails and commits nothing (no producer can learn of a child whose parents are not sealed).
    let fence = keys::shard_fence(&stream(), ShardId(0));
    let _: () = conn
        .hset(&fence, shard_fence_fields::ROUTING_VERSION, "x")
        .await
        .unwrap();
    assert!(coordinator.add_shards(&stream(), 2, None).await.is_err());
    let r = routing().await;
    assert_eq!((r.shard_count, r.routing_version.0), (2, 1), "nothing committed");
    assert!(r.growths.is_empty());
    let child: Option<String> = conn
        .hget(
            keys::shard_fence(&stream(), ShardId(2)),
            shard_fence_fields::BORN_VERSION,
        )
        .await
        .unwrap();
    assert_eq!(child, None, "no child is recorded before every parent is sealed");

    // Repaired: the retry seals both parents, records the children, then commits.
    let _: () = conn
        .hset(&fence, shard_fence_fields::ROUTING_VERSION, "1")
        .await
        .unwrap();
    coordinator.add_shards(&stream(), 2, None).await.unwrap();
    let r = routing().await;
    assert_eq!(r.shard_count, 4);
    assert!(r.growths[0].sealed(), "{:?}", r.growths);
    assert_eq!(fence_of(&mut conn, 0).await.as_deref(), Some("2"));
    for child in [2, 3] {
        let born: Option<String> = conn
            .hget(
                keys::shard_fence(&stream(), ShardId(child)),
                shard_fence_fields::BORN_VERSION,
            )
            .await
            .unwrap();
        assert_eq!(born.as_deref(), Some("2"), "child {child}");
    }
}

#[tokio::test]
async fn a_tick_finishes_the_seals_of_a_growth_recorded_unsealed() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let coordinator = coordinator_with(&redis, 2).await;
    let group = GroupName::new("g").unwrap();
    coordinator.add_shards(&stream(), 2, None).await.unwrap();
    let routing = || async {
        let (_, json) = coordinator.store().read_routing(&stream()).await.unwrap().unwrap();
        protocol::metadata::StreamRouting::decode(&json).unwrap()
    };
    let sealed = routing().await.growths[0].seals.clone();
    // The growth as an older coordinator recorded it when it died between its routing commit and the seals.
    let mut unsealed = routing().await;
    unsealed.growths[0].seals.clear();
    let _: () = conn
        .hset(
            keys::stream_routing(&stream()),
            keys::fields::AGGREGATE,
            unsealed.encode(),
        )
        .await
        .unwrap();
    coordinator.tick_group(&stream(), &group).await.unwrap();
    let g = &routing().await.growths[0];
    assert_eq!(g.seals, sealed, "sealed again at the positions the parents recorded");
    let store = coord_server::store::Store::connect(&redis.url()).await.unwrap();
    let meta = store.group_metadata(&stream(), &group).await.unwrap().unwrap();
    assert!(
        meta.reshards.is_empty(),
        "empty parents are drained at once: {:?}",
        meta.reshards
    );
}

/// A coordinator with stream `orders` of `shards` shards (group `g`).
async fn coordinator_with(redis: &RedisServer, shards: u32) -> Coordinator {
    let coordinator = Coordinator::connect(Config::new(redis.url())).await.unwrap();
    coordinator
        .create_group(
            &stream(),
            &GroupName::new("g").unwrap(),
            &CreateGroupRequest {
                shard_count: Some(shards),
                timings: None,
            },
        )
        .await
        .unwrap();
    coordinator
}

/// Issue 30: Redis loses a growth's routing commit (a failover to a replica that had the records and seals but not
/// the commit; here the routing hash put back as it was before). The tick sees the records beyond the routing and
/// restores the growth from them: same parents, same children, the parents' own seals, under a version above
/// every one issued.
#[tokio::test]
async fn a_growth_the_routing_lost_is_restored_from_the_shards_records() {
    let redis = RedisServer::start().await;
    let coordinator = coordinator_with(&redis, 4).await;
    let routing_key = keys::stream_routing(&stream());
    let before = redis.snapshot_keys(&routing_key).await;
    let grown = coordinator.add_shards(&stream(), 4, None).await.unwrap();
    assert_eq!(grown.shard_count, 8);
    let seals = {
        let (_, json) = coordinator.store().read_routing(&stream()).await.unwrap().unwrap();
        protocol::metadata::StreamRouting::decode(&json).unwrap().growths[0]
            .seals
            .clone()
    };
    redis.restore_snapshot(&before).await;
    let lost = coordinator.describe_routing(&stream()).await.unwrap();
    assert_eq!(lost.shard_count, 4);
    assert_eq!(
        lost.shards_beyond_routing, 4,
        "the admin view shows the children beyond the routing"
    );

    coordinator.tend_routing(&stream()).await.unwrap();
    let restored = coordinator.describe_routing(&stream()).await.unwrap();
    assert_eq!(restored.shard_count, 8);
    assert_eq!(restored.shards_beyond_routing, 0);
    assert!(
        restored.routing_version > grown.routing_version,
        "the lost number is retired: {} after {}",
        restored.routing_version,
        grown.routing_version
    );
    let (_, json) = coordinator.store().read_routing(&stream()).await.unwrap().unwrap();
    let routing = protocol::metadata::StreamRouting::decode(&json).unwrap();
    let g = routing.growths.last().unwrap();
    assert_eq!((g.parents, g.shard_count), (4, 8));
    assert_eq!(g.seals, seals, "each parent keeps the seal it recorded");
    // Nothing more to do: a second look changes nothing.
    coordinator.tend_routing(&stream()).await.unwrap();
    let again = coordinator.describe_routing(&stream()).await.unwrap();
    assert_eq!(again.routing_version, restored.routing_version);
}

/// Issue 30: on a Cluster each shard record is on the master of its own slot, and a failover there can lose one
/// while the routing keeps the shard. Fenced publishes to it would be refused for good; the tick's sweep writes the
/// record again, with the birth the routing gives the shard, and never touches a record that is there.
#[tokio::test]
async fn a_shard_record_redis_lost_is_written_again_from_the_routing() {
    let redis = RedisServer::start().await;
    let coordinator = coordinator_with(&redis, 2).await;
    coordinator.add_shards(&stream(), 2, None).await.unwrap();
    let mut conn = redis.connection().await;
    let born = |conn: &mut redis::aio::MultiplexedConnection, shard: u32| {
        let key = keys::shard_fence(&stream(), ShardId(shard));
        let mut conn = conn.clone();
        async move {
            let v: Option<String> = conn.hget(key, shard_fence_fields::BORN_VERSION).await.unwrap();
            v
        }
    };
    let child = born(&mut conn, 3).await.expect("the child's record");
    let first = born(&mut conn, 1).await.expect("a first shard's record");
    for shard in [1, 3] {
        let _: () = conn
            .hdel(
                keys::shard_fence(&stream(), ShardId(shard)),
                shard_fence_fields::BORN_VERSION,
            )
            .await
            .unwrap();
    }
    coordinator.tend_routing(&stream()).await.unwrap();
    assert_eq!(born(&mut conn, 3).await, Some(child));
    assert_eq!(born(&mut conn, 1).await, Some(first));
    assert_eq!(
        fence_of(&mut conn, 1).await.as_deref(),
        Some("2"),
        "the parent's fence is kept"
    );
}

/// Issue 30: the records carry their layouts' shard counts. A growth writes them (the parents' `fenceCount`, the
/// children's `bornCount`); a record that names more shards than the routing at or below its version (left by a
/// Cluster master that lost the retirement's seal) gets the routing's count from the tick's sweep, its fence
/// kept.
#[tokio::test]
async fn the_records_hold_their_layouts_counts_and_the_sweep_lowers_one_above_the_routing() {
    let redis = RedisServer::start().await;
    let coordinator = coordinator_with(&redis, 2).await;
    let grown = coordinator.add_shards(&stream(), 2, None).await.unwrap();
    let mut conn = redis.connection().await;
    let reader = conn.clone();
    let field = |shard: u32, field: &'static str| {
        let key = keys::shard_fence(&stream(), ShardId(shard));
        let mut conn = reader.clone();
        async move {
            let v: Option<String> = conn.hget(key, field).await.unwrap();
            v
        }
    };
    assert_eq!(
        field(0, shard_fence_fields::FENCE_COUNT).await.as_deref(),
        Some("4"),
        "a parent"
    );
    assert_eq!(
        field(3, shard_fence_fields::BORN_COUNT).await.as_deref(),
        Some("4"),
        "a child"
    );
    assert_eq!(
        field(1, shard_fence_fields::BORN_COUNT).await.as_deref(),
        Some("2"),
        "a first shard"
    );
    let _: () = conn
        .hset(
            keys::shard_fence(&stream(), ShardId(1)),
            shard_fence_fields::FENCE_COUNT,
            8,
        )
        .await
        .unwrap();
    let _: () = conn
        .hset(
            keys::shard_fence(&stream(), ShardId(3)),
            shard_fence_fields::BORN_COUNT,
            8,
        )
        .await
        .unwrap();
    coordinator.tend_routing(&stream()).await.unwrap();
    assert_eq!(field(1, shard_fence_fields::FENCE_COUNT).await.as_deref(), Some("4"));
    assert_eq!(field(3, shard_fence_fields::BORN_COUNT).await.as_deref(), Some("4"));
    assert_eq!(
        field(1, shard_fence_fields::ROUTING_VERSION).await,
        Some(grown.routing_version.to_string()),
        "the fence is kept"
    );
}

/// Issue 30: a fence above the routing on a shard other than shard 0 (shard 0's master lost that seal too) is
/// found by the tick's sweep, which restores the routing past it: its version above the fence, every shard's
/// fence with it.
#[tokio::test]
async fn a_fence_above_the_routing_on_any_listed_shard_restores_it_past_that_fence() {
    let redis = RedisServer::start().await;
    let coordinator = coordinator_with(&redis, 4).await;
    let before = coordinator.describe_routing(&stream()).await.unwrap();
    let mut conn = redis.connection().await;
    let _: () = conn
        .hset(
            keys::shard_fence(&stream(), ShardId(2)),
            shard_fence_fields::ROUTING_VERSION,
            77,
        )
        .await
        .unwrap();
    coordinator.tend_routing(&stream()).await.unwrap();
    let after = coordinator.describe_routing(&stream()).await.unwrap();
    assert!(after.routing_version.0 > 77, "{after:?}");
    assert_eq!(after.shard_count, before.shard_count);
    for shard in 0..4 {
        assert_eq!(
            fence_of(&mut conn, shard).await,
            Some(after.routing_version.to_string()),
            "shard {shard}"
        );
    }
}
