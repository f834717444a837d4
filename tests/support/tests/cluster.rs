//! The local Redis Cluster of `test_support::cluster` against real `redis-server --cluster-enabled yes` nodes, and
//! the spread of shard keys over 3 masters (the table in docs/cluster.md).

use std::collections::BTreeMap;
use std::time::Duration;

use protocol::names::StreamName;
use protocol::{keys, ShardId};
use redis::AsyncCommands;
use test_support::cluster::{even_slot_ranges, key_slot, RedisCluster};
use test_support::wait_until;

async fn set(con: &mut redis::cluster_async::ClusterConnection, key: &str, value: &str) {
    let _: () = con.set(key, value).await.unwrap_or_else(|e| panic!("SET {key}: {e}"));
}

async fn get(con: &mut redis::cluster_async::ClusterConnection, key: &str) -> Option<String> {
    con.get(key).await.unwrap_or_else(|e| panic!("GET {key}: {e}"))
}

#[tokio::test]
async fn forms_three_masters_with_the_even_split() {
    let cluster = RedisCluster::start().await;
    let view = cluster.view().await;
    let mut masters: Vec<(u16, u16)> = view.iter().filter(|e| e.master).flat_map(|e| e.slots.clone()).collect();
    masters.sort_unstable();
    assert_eq!(masters, vec![(0, 5460), (5461, 10922), (10923, 16383)]);
    assert_eq!(cluster.masters().await, vec![0, 1, 2]);
    for (i, (first, last)) in even_slot_ranges(3).into_iter().enumerate() {
        assert_eq!(cluster.owner_of_slot(first).await, i);
        assert_eq!(cluster.owner_of_slot(last).await, i);
    }
    let mut con = cluster.connection().await;
    for n in 0..30 {
        set(&mut con, &format!("k{n}"), &n.to_string()).await;
    }
    for n in 0..30 {
        assert_eq!(get(&mut con, &format!("k{n}")).await, Some(n.to_string()));
    }
}

#[tokio::test]
async fn key_slot_agrees_with_cluster_keyslot() {
    let cluster = RedisCluster::start().await;
    let mut keys_checked = Vec::new();
    for stream in ["orders", "a", "payments-eu"] {
        let s = StreamName::new(stream).unwrap();
        for n in [0u32, 1, 7, 63, 255, 1023] {
            keys_checked.push(keys::shard_stream(&s, ShardId(n)));
            keys_checked.push(keys::shard_fence(&s, ShardId(n)));
            keys_checked.push(keys::producer_sequence(&s, ShardId(n), "p-1"));
        }
        keys_checked.push(keys::stream_routing(&s));
    }
    keys_checked.push(keys::groups_index());
    keys_checked.push(keys::streams_index());
    for n in 0..300 {
        keys_checked.push(format!("plain-{n}"));
        keys_checked.push(format!("x{{}}{{t{n}}}"));
        keys_checked.push(format!("{{{{{n}}}}}z"));
    }
    for (i, key) in keys_checked.iter().enumerate() {
        let redis = cluster.redis_key_slot(i % 3, key.as_bytes()).await;
        assert_eq!(key_slot(key.as_bytes()), redis, "slot of {key:?}");
    }
    assert!(keys_checked.len() >= 900);
}

#[tokio::test]
async fn owner_of_key_serves_it_and_the_others_redirect() {
    let cluster = RedisCluster::start().await;
    let mut con = cluster.connection().await;
    let s = StreamName::new("orders").unwrap();
    for n in 0..8 {
        let key = keys::shard_fence(&s, ShardId(n));
        set(&mut con, &key, "1").await;
        let owner = cluster.owner_of_key(&key).await;
        for (i, node) in cluster.nodes().iter().enumerate() {
            let mut direct = node.server().connection().await;
            let reply: redis::RedisResult<Option<String>> = redis::cmd("GET").arg(&key).query_async(&mut direct).await;
            if i == owner {
                assert_eq!(reply.unwrap(), Some("1".to_owned()), "{key} on its owner {i}");
            } else {
                let e = reply.expect_err("a node that does not serve the slot redirects");
                assert_eq!(e.code(), Some("MOVED"), "{key} on node {i}: {e}");
            }
        }
    }
}

#[tokio::test]
async fn migrate_slot_moves_every_key_and_clients_follow() {
    let cluster = RedisCluster::start().await;
    let mut con = cluster.connection().await;
    // 250 keys in one slot (one hash tag), more than two MIGRATE batches.
    let key = |n: usize| format!("redis-stream:shard:{{orders:3:x}}:k{n}");
    let slot = key_slot(key(0).as_bytes());
    for n in 0..250 {
        set(&mut con, &key(n), &n.to_string()).await;
    }
    let from = cluster.owner_of_slot(slot).await;
    let to = (from + 1) % 3;
    assert_eq!(cluster.migrate_slot(slot, to).await, 250);
    assert_eq!(cluster.owner_of_slot(slot).await, to);
    let mut direct = cluster.node(to).server().connection().await;
    let count: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!(count, 250);
    // The old connection's slot map is stale: it follows MOVED. A new one reads the new map.
    for n in 0..250 {
        assert_eq!(get(&mut con, &key(n)).await, Some(n.to_string()));
    }
    let mut fresh = cluster.connection().await;
    for n in (0..250).step_by(7) {
        assert_eq!(get(&mut fresh, &key(n)).await, Some(n.to_string()));
    }
}

#[tokio::test]
async fn a_slot_migrating_in_steps_keeps_serving_writes() {
    let cluster = RedisCluster::start().await;
    let mut con = cluster.connection().await;
    let key = |n: usize| format!("{{busy}}:{n}");
    let slot = key_slot(key(0).as_bytes());
    for n in 0..150 {
        set(&mut con, &key(n), "before").await;
    }
    let from = cluster.owner_of_slot(slot).await;
    let to = (from + 2) % 3;
    let migration = cluster.begin_migration(slot, to).await;
    assert_eq!((migration.from(), migration.to(), migration.slot()), (from, to, slot));
    assert_eq!(migration.move_keys(100).await, 100);
    // Half moved: reads of moved keys and writes of new keys are answered with ASK, which the client follows.
    for n in 0..150 {
        assert_eq!(get(&mut con, &key(n)).await, Some("before".to_owned()), "{}", key(n));
    }
    for n in 150..200 {
        set(&mut con, &key(n), "during").await;
    }
    while migration.move_keys(30).await > 0 {}
    migration.finish().await;
    // The target took the slot with a config epoch above the source's: no claim of the source can win it back.
    assert!(cluster.config_epoch(to).await > cluster.config_epoch(from).await);
    assert_eq!(cluster.owner_of_slot(slot).await, to);
    for n in 0..200 {
        let want = if n < 150 { "before" } else { "during" };
        assert_eq!(get(&mut con, &key(n)).await.as_deref(), Some(want), "{}", key(n));
    }
}

#[tokio::test]
async fn takeover_makes_the_replica_master_of_a_killed_masters_slots() {
    let cluster = RedisCluster::builder()
        .replicas(true)
        .node_timeout_ms(1000)
        .start()
        .await;
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.masters().await, vec![0, 1, 2]);
    let mut con = cluster.connection().await;
    let key = (0..)
        .map(|n| format!("{{t{n}}}:before"))
        .find(|k| key_slot(k.as_bytes()) <= 5460)
        .unwrap();
    let key = key.as_str();
    assert_eq!(cluster.owner_of_key(key).await, 0);
    set(&mut con, key, "v").await;
    test_support::wait_replicated(cluster.node(0).server()).await;

    cluster.kill(0);
    assert!(!cluster.node(0).server().is_running());
    cluster.wait_failing(0).await;
    cluster.takeover(3).await;
    assert_eq!(cluster.masters().await, vec![1, 2, 3]);
    assert_eq!(cluster.owner_of_slot(0).await, 3);
    cluster.wait_healthy().await;
    let info = cluster.node(3).server().info("replication").await;
    assert!(info.contains("role:master"), "{info}");

    let mut fresh = cluster.connection().await;
    assert_eq!(get(&mut fresh, key).await.as_deref(), Some("v"));
    wait_until(
        Duration::from_secs(20),
        "the old connection to follow the failover",
        || {
            let mut con = con.clone();
            async move { matches!(con.get::<_, Option<String>>(key).await, Ok(Some(v)) if v == "v") }
        },
    )
    .await;
}

#[tokio::test]
async fn takeover_with_the_master_alive_demotes_it() {
    let cluster = RedisCluster::start_with_replicas().await;
    cluster.takeover(4).await;
    assert_eq!(cluster.masters().await, vec![0, 2, 4]);
    let view = cluster.view().await;
    let old = view.iter().find(|e| e.id == cluster.node(1).id()).unwrap();
    assert!(!old.master);
    assert_eq!(old.replica_of.as_deref(), Some(cluster.node(4).id()));
    cluster.wait_healthy().await;
}

/// Keys per master of `slots` under the 3-master even split.
fn per_master(slots: impl Iterator<Item = u16>) -> [usize; 3] {
    let ranges = even_slot_ranges(3);
    let mut counts = [0; 3];
    for slot in slots {
        if let Some(i) = ranges.iter().position(|&(a, b)| a <= slot && slot <= b) {
            counts[i] += 1;
        }
    }
    counts
}

/// The slot of shard `n` under layout 1, which hashed `{<stream>:<n>}`.
fn hashed_slot(stream: &str, n: u32) -> u16 {
    key_slot(format!("redis-stream:shard:{{{stream}:{n}}}").as_bytes())
}

#[test]
fn spread_of_shard_keys_over_three_masters() {
    let mut table = String::from(
        "| stream | N | hashed `{<stream>:<n>}` (layout 1) min / max per master | max/mean | chosen slots (layout 2) \
         min / max | max/mean |\n|---|---|---|---|---|---|\n",
    );
    let mut worst: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for stream in ["orders", "payments-eu", "s"] {
        let s = StreamName::new(stream).unwrap();
        for n in [8u32, 16, 24, 64, 100, 256, 1024] {
            let mean = f64::from(n) / 3.0;
            let hashed = per_master((0..n).map(|i| hashed_slot(stream, i)));
            let chosen = per_master((0..n).map(|i| key_slot(keys::shard_stream(&s, ShardId(i)).as_bytes())));
            for counts in [hashed, chosen] {
                assert_eq!(counts.iter().sum::<usize>(), n as usize);
                assert!(
                    counts.iter().all(|&c| c >= 1),
                    "{stream} N={n}: every master gets a shard: {counts:?}"
                );
            }
            let ratio = |c: [usize; 3]| *c.iter().max().unwrap() as f64 / mean;
            let (rh, rc) = (ratio(hashed), ratio(chosen));
            // The layout's keys are within one shard of the even share for every N.
            let ideal = (f64::from(n) / 3.0).ceil() as usize;
            assert!(*chosen.iter().max().unwrap() <= ideal + 1, "{stream} N={n}: {chosen:?}");
            let w = worst.entry(n).or_insert((0.0, 0.0));
            *w = (w.0.max(rh), w.1.max(rc));
            table.push_str(&format!(
                "| {stream} | {n} | {} / {} | {rh:.3} | {} / {} | {rc:.3} |\n",
                hashed.iter().min().unwrap(),
                hashed.iter().max().unwrap(),
                chosen.iter().min().unwrap(),
                chosen.iter().max().unwrap(),
            ));
        }
    }
    println!("{table}");
    println!("worst max/mean per N (hashed, chosen): {worst:?}");
}
