//! The slot map, node pool and shared connection against a local 3-master cluster of real redis-server
//! processes.

use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis_link::{Connection, NodeAddr, NodePool, Redirect, RedirectKind, RedisTarget};
use test_support::cluster::{key_slot, RedisCluster};

fn pool(cluster: &RedisCluster) -> NodePool {
    let target = RedisTarget::parse(&format!("cluster:{}", cluster.urls()[0])).unwrap();
    NodePool::new(target.urls(), AsyncConnectionConfig::new(), None).unwrap()
}

fn addr(cluster: &RedisCluster, index: usize) -> NodeAddr {
    NodeAddr::new("127.0.0.1", cluster.node(index).port())
}

#[tokio::test]
async fn the_slot_map_names_the_master_every_node_agrees_on() {
    let cluster = RedisCluster::start().await;
    let pool = pool(&cluster);
    let map = pool.slot_map().await.unwrap();
    assert_eq!(map.masters().len(), 3);
    for slot in [
        0u16,
        5460,
        5461,
        10922,
        10923,
        16383,
        key_slot(b"redis-stream:shard:{orders:3}"),
    ] {
        let owner = cluster.owner_of_slot(slot).await;
        assert_eq!(map.master_of(slot), &addr(&cluster, owner), "slot {slot}");
    }
}

#[tokio::test]
async fn a_moved_slot_answers_moved_until_the_map_is_read_again() {
    let cluster = RedisCluster::start().await;
    let pool = pool(&cluster);
    let key = "redis-stream:shard:{orders:1}";
    let slot = key_slot(key.as_bytes());
    let (before, mut conn) = pool.master_connection(slot).await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(key)
        .arg("*")
        .arg("f")
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();
    let from = cluster.owner_of_slot(slot).await;
    let to = (from + 1) % 3;
    cluster.migrate_slot(slot, to).await;

    // The old master refuses with MOVED, which names the new one; nothing ran there.
    let err = redis::cmd("XLEN")
        .arg(key)
        .query_async::<i64>(&mut conn)
        .await
        .unwrap_err();
    let redirect = Redirect::from_error(&err).expect("a redirect");
    assert_eq!(redirect.kind, RedirectKind::Moved);
    assert_eq!((redirect.slot, &redirect.to), (slot, &addr(&cluster, to)));

    let map = pool.refresh().await.unwrap();
    assert_ne!(map.master_of(slot), &before);
    let (now, mut conn) = pool.master_connection(slot).await.unwrap();
    assert_eq!(now, addr(&cluster, to));
    let len: i64 = redis::cmd("XLEN").arg(key).query_async(&mut conn).await.unwrap();
    assert_eq!(len, 1, "the migrated stream keeps its entry");
}

#[tokio::test]
async fn the_shared_cluster_connection_routes_keys_and_scripts_by_slot() {
    let cluster = RedisCluster::start().await;
    let mut conn = Connection::cluster(&cluster.urls(), None, Duration::from_secs(2), Duration::from_secs(2))
        .await
        .unwrap();
    assert!(conn.is_cluster());
    let script = redis::Script::new("return redis.call('INCR', KEYS[1])");
    for n in 0..16 {
        let key = format!("redis-stream:coord:{{orders:g{n}}}:metadata");
        let v: i64 = script.key(&key).invoke_async(&mut conn).await.unwrap();
        assert_eq!(v, 1);
    }
    // The keys landed on every master: each slot's owner holds its key.
    let pool = pool(&cluster);
    let map = pool.slot_map().await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for n in 0..16 {
        let key = format!("redis-stream:coord:{{orders:g{n}}}:metadata");
        let node = map.master_of_key(key.as_bytes()).clone();
        let mut direct = pool.connection(&node).await.unwrap();
        let v: i64 = redis::cmd("GET").arg(&key).query_async(&mut direct).await.unwrap();
        assert_eq!(v, 1);
        seen.insert(node);
    }
    assert_eq!(seen.len(), 3);
}
