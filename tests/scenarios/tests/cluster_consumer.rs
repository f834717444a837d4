//! Consumers on Redis Cluster: one group over a stream whose shards are spread over three masters, through join,
//! rebalance and drain, a kill -9 of a member process, a live migration of a busy shard's slot, and a master
//! failover, with the invariant checker: never two readers of one shard, no acknowledged record lost, per-key
//! order kept.
//!
//! The records are written with `XADD` through redis-rs's cluster connection (the producer on a cluster has its
//! own tests), each acknowledged one recorded in the [`History`]; the coordinator runs on the same cluster.

mod common;

use common::*;
use protocol::keys;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::routing::shard_for_key;
use protocol::EntryId;
use protocol::ShardId;
use redis::cluster_async::ClusterConnection;
use scenario_tests::stall_log::{wall_us, wall_us_as_instant, Kind, Record};
use scenario_tests::{Handled, History, Publish};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream_consumer::{ConsumerBuilder, ConsumerHandle};
use stream_producer::Producer;
use test_support::cluster::{key_slot, RedisCluster};
use test_support::wait_for;

const SHARDS: u32 = 8;
const KEYS: u64 = 64;

/// The cluster target of `cluster` as the components take it.
fn target(cluster: &RedisCluster) -> String {
    format!("cluster:{}", cluster.urls().join(","))
}

struct Env {
    cluster: RedisCluster,
    coord: Coord,
    stream: StreamName,
    group: GroupName,
    conn: ClusterConnection,
}

impl Env {
    async fn start(cluster: RedisCluster, name: &str) -> Env {
        init_tracing();
        let coord = Coord::start(&target(&cluster)).await;
        let stream = StreamName::new(format!("{name}-stream")).unwrap();
        let group = GroupName::new(format!("{name}-group")).unwrap();
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
            .expect("group created");
        let conn = cluster.connection().await;
        Env {
            cluster,
            coord,
            stream,
            group,
            conn,
        }
    }

    fn shard_key(&self, shard: u32) -> String {
        keys::shard_stream(&self.stream, ShardId(shard))
    }

    fn builder(&self, member: &str) -> ConsumerBuilder {
        consumer_builder(
            &self.stream,
            &self.group,
            member,
            vec![self.coord.url()],
            target(&self.cluster),
        )
    }

    fn spawn(&self, member: &str, history: &History) -> ConsumerHandle {
        Scenario::spawn_with(self.builder(member), member, history, &Gate::open())
    }

    /// Writes record `i` (key `key-<i % KEYS>`) to its shard; records it when Redis acknowledged it.
    async fn publish(&self, history: &History, i: u64) -> bool {
        let key = format!("key-{}", i % KEYS);
        publish_key(&self.conn, &self.stream, history, &key, i).await
    }

    async fn publish_range(&self, history: &History, from: u64, n: u64) {
        for i in from..from + n {
            assert!(self.publish(history, i).await, "record {i} written");
        }
    }

    /// How many masters hold at least one shard.
    async fn masters_of_shards(&self) -> usize {
        let mut owners = BTreeSet::new();
        for shard in 0..SHARDS {
            owners.insert(self.cluster.owner_of_key(&self.shard_key(shard)).await);
        }
        owners.len()
    }
}

async fn publish_key(conn: &ClusterConnection, stream: &StreamName, history: &History, key: &str, i: u64) -> bool {
    let shard = shard_for_key(key.as_bytes(), SHARDS);
    let mut conn = conn.clone();
    let id: Result<String, _> = redis::cmd("XADD")
        .arg(keys::shard_stream(stream, shard))
        .arg("*")
        .arg("key")
        .arg(key)
        .arg("n")
        .arg(i)
        .query_async(&mut conn)
        .await;
    match id {
        Ok(id) => {
            history.record_publish(Publish {
                key: Some(key.to_owned()),
                shard: shard.0,
                entry: id.parse::<EntryId>().expect("entry id"),
                routing_version: 1,
                acked_at: Instant::now(),
            });
            true
        }
        Err(_) => false,
    }
}

/// Waits until node `node` of the cluster serves a blocking-read connection of `member`'s reader of `shard`
/// (named by the consumer: `stream-consumer:<member>:<shard>`).
async fn wait_reader_on(cluster: &RedisCluster, node: usize, member: &str, shard: u32) {
    let name = format!("name=stream-consumer:{member}:{shard} ");
    wait_for(DEADLINE, "the shard's reader to read from the node", || async {
        let mut conn = cluster.node(node).server().connection().await;
        let list: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut conn).await.ok()?;
        list.contains(&name).then_some(())
    })
    .await;
}

/// Waits until `history` holds at least `n` acknowledged publishes.
async fn wait_written(history: &History, n: usize) {
    wait_for(DEADLINE, "records to be written", || async {
        (history.publishes().len() >= n).then_some(())
    })
    .await
}

async fn wait_all_handled(history: &History, what: &str) {
    wait_for(DEADLINE * 2, what, || async {
        history.all_published_handled().then_some(())
    })
    .await;
}

async fn wait_members(api: &Coord, s: &Env, n: usize) {
    wait_for(DEADLINE, "every member to hold shards and nothing pending", || async {
        let d = api.coordinator().describe_group(&s.stream, &s.group).await.ok()?;
        let holding = d.members.iter().filter(|m| !m.assigned.is_empty()).count();
        let all: usize = d.members.iter().map(|m| m.assigned.len()).sum();
        let settled = d.members.iter().all(|m| m.revoke.is_empty() && m.pending.is_empty());
        (holding == n && all == SHARDS as usize && settled).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_shards_spread_over_three_masters_through_join_rebalance_and_drain() {
    let env = Env::start(RedisCluster::start().await, "cjoin").await;
    let masters = env.masters_of_shards().await;
    assert!(
        masters >= 2,
        "8 shards over 3 masters land on at least 2 of them ({masters})"
    );
    let history = History::new();

    let a = env.spawn("a", &history);
    wait_members(&env.coord, &env, 1).await;
    env.publish_range(&history, 0, 200).await;
    wait_all_handled(&history, "a to handle the first records").await;

    // b joins: a drains half of its shards, b takes them once they are released.
    let b = env.spawn("b", &history);
    env.publish_range(&history, 200, 200).await;
    wait_members(&env.coord, &env, 2).await;
    let c = env.spawn("c", &history);
    env.publish_range(&history, 400, 200).await;
    wait_members(&env.coord, &env, 3).await;
    env.publish_range(&history, 600, 200).await;

    // b leaves: it drains, the others take its shards.
    b.close().await.expect("b closes");
    env.publish_range(&history, 800, 200).await;
    wait_members(&env.coord, &env, 2).await;
    wait_all_handled(&history, "every record to be handled").await;
    history.assert_holds();
    let handled = history.handled();
    for member in ["a", "b", "c"] {
        assert!(handled.iter().any(|h| h.member == member), "{member} handled records");
    }
    println!(
        "cluster join/rebalance/drain: {} records over {SHARDS} shards on {masters} masters, {} handler runs",
        history.publishes().len(),
        handled.len()
    );
    a.close().await.expect("a closes");
    c.close().await.expect("c closes");
}

/// A member process (`stall_worker`) on the cluster.
fn spawn_worker(env: &Env, member: &str, dir: &std::path::Path) -> Child {
    let worker = StallWorker {
        coordinators: env.coord.url(),
        redis: target(&env.cluster),
        stream: env.stream.to_string(),
        group: env.group.to_string(),
        handle: Duration::from_millis(2),
        read_failure: None,
    };
    worker.spawn(member, dir, member)
}

fn worker_records(dir: &std::path::Path, member: &str) -> Vec<Record> {
    let text = std::fs::read_to_string(dir.join(format!("{member}.log"))).unwrap_or_default();
    text.lines().filter_map(Record::parse).collect()
}

/// Adds the completed handler runs of a worker's record file to `history`.
fn record_worker(history: &History, records: &[Record]) {
    let starts: BTreeMap<_, _> = records
        .iter()
        .filter(|r| r.kind == Kind::Start)
        .map(|r| ((r.shard, r.entry, r.start_us), r))
        .collect();
    for end in records.iter().filter(|r| r.kind == Kind::End) {
        let start = starts.get(&(end.shard, end.entry, end.start_us));
        history.record_handled(Handled {
            member: end.member.clone(),
            shard: end.shard,
            entry: end.entry,
            key: None,
            delivery: 1,
            started: wall_us_as_instant(end.start_us),
            ended: wall_us_as_instant(end.at_us),
            started_wall: std::time::UNIX_EPOCH + Duration::from_micros(end.start_us),
            lease_until: start.and_then(|s| s.lease_end_us).map(wall_us_as_instant),
            ok: true,
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_process_killed_with_sigkill_hands_its_shards_over_and_nothing_is_lost() {
    let env = Env::start(RedisCluster::start().await, "ckill").await;
    let dir = std::env::temp_dir().join(format!("cluster-kill-{}-{}", std::process::id(), wall_us()));
    std::fs::create_dir_all(&dir).expect("record dir");
    let history = History::new();
    let mut worker = spawn_worker(&env, "w", &dir);
    wait_members(&env.coord, &env, 1).await;
    let a = env.spawn("a", &history);
    wait_members(&env.coord, &env, 2).await;
    env.publish_range(&history, 0, 300).await;
    wait_for(DEADLINE, "the worker process to handle records", || async {
        (worker_records(&dir, "w").iter().filter(|r| r.kind == Kind::End).count() > 20).then_some(())
    })
    .await;

    let killed_at = Instant::now();
    worker.kill().expect("kill -9 the worker");
    let _ = worker.wait();
    env.publish_range(&history, 300, 300).await;
    wait_members(&env.coord, &env, 1).await;
    let moved_after = killed_at.elapsed();
    let records = worker_records(&dir, "w");
    record_worker(&history, &records);
    wait_all_handled(&history, "a to handle everything, the dead worker's shards included").await;
    history.assert_holds();
    println!(
        "cluster kill -9: worker handled {} records before the kill; its shards moved to a {} ms after it",
        records.iter().filter(|r| r.kind == Kind::End).count(),
        moved_after.as_millis()
    );
    a.close().await.expect("a closes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Keys of `shard` among `key-0..`.
fn keys_of_shard(shard: u32, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("key-{i}"))
        .filter(|k| shard_for_key(k.as_bytes(), SHARDS).0 == shard)
        .take(n)
        .collect()
}

/// Publishes to `keys` in turn until `stop`; returns how many were acknowledged and how many failed.
async fn publish_until(
    conn: ClusterConnection,
    stream: StreamName,
    history: History,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
    counter: Arc<AtomicU64>,
) -> (u64, u64) {
    let (mut ok, mut failed) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        let i = counter.fetch_add(1, Ordering::Relaxed);
        let key = &keys[(i as usize) % keys.len()];
        if publish_key(&conn, &stream, &history, key, i).await {
            ok += 1;
        } else {
            failed += 1;
        }
    }
    (ok, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_of_a_busy_shard_migrates_under_its_reader_with_nothing_lost_and_order_kept() {
    let env = Env::start(RedisCluster::start().await, "cmig").await;
    let history = History::new();
    let a = env.spawn("a", &history);
    wait_members(&env.coord, &env, 1).await;
    let shard = 3;
    let key = env.shard_key(shard);
    let slot = key_slot(key.as_bytes());
    let from = env.cluster.owner_of_slot(slot).await;
    let to = (from + 1) % 3;
    wait_reader_on(&env.cluster, from, "a", shard).await;

    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let publisher = tokio::spawn(publish_until(
        env.conn.clone(),
        env.stream.clone(),
        history.clone(),
        keys_of_shard(shard, 8),
        Arc::clone(&stop),
        Arc::clone(&counter),
    ));
    wait_written(&history, 300).await;
    let started = Instant::now();
    let migration = env.cluster.begin_migration(slot, to).await;
    wait_written(&history, history.publishes().len() + 300).await;
    let moved = migration.move_keys(100).await;
    wait_written(&history, history.publishes().len() + 300).await;
    migration.finish().await;
    let migrated_in = started.elapsed();
    wait_written(&history, history.publishes().len() + 300).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = publisher.await.expect("publisher");
    assert_eq!(env.cluster.owner_of_slot(slot).await, to);
    wait_all_handled(&history, "every record of the migrated shard to be handled").await;
    history.assert_holds();
    let handled = history.handled();
    let after: Vec<_> = handled.iter().filter(|h| h.started > started + migrated_in).collect();
    assert!(!after.is_empty(), "the reader handled records after the migration");
    wait_reader_on(&env.cluster, to, "a", shard).await;
    println!(
        "cluster slot migration: {ok} records written ({failed} refused), {moved} keys moved in {} ms, all handled in \
         per-key order",
        migrated_in.as_millis()
    );
    a.close().await.expect("a closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_of_a_shards_master_moves_its_reader_to_the_promoted_replica() {
    let env = Env::start(RedisCluster::start_with_replicas().await, "cfail").await;
    let history = History::new();
    let a = env.spawn("a", &history);
    wait_members(&env.coord, &env, 1).await;
    // A shard on a master that does not hold the group's metadata (that failover is the coordinator's test).
    let metadata = env
        .cluster
        .owner_of_key(&keys::group_metadata(&env.stream, &env.group))
        .await;
    let mut shard = None;
    for s in 0..SHARDS {
        if env.cluster.owner_of_key(&env.shard_key(s)).await != metadata {
            shard = Some(s);
            break;
        }
    }
    let shard = shard.expect("a shard on another master");
    let master = env.cluster.owner_of_key(&env.shard_key(shard)).await;
    let replica = master + 3;
    let keys = keys_of_shard(shard, 8);
    for (i, key) in keys.iter().cycle().take(200).enumerate() {
        assert!(publish_key(&env.conn, &env.stream, &history, key, i as u64).await);
    }
    wait_all_handled(&history, "the records before the failover to be handled").await;
    let before = history.publishes().len();
    wait_reader_on(&env.cluster, master, "a", shard).await;

    let failed_at = Instant::now();
    env.cluster.kill(master);
    env.cluster.wait_failing(master).await;
    env.cluster.takeover(replica).await;
    let promoted_in = failed_at.elapsed();
    let after_takeover = Instant::now();
    let mut i = 1000;
    wait_for(DEADLINE, "writes to the promoted master to succeed", || {
        i += 1;
        let key = keys[i % keys.len()].clone();
        let (conn, stream, history) = (env.conn.clone(), env.stream.clone(), history.clone());
        async move {
            publish_key(&conn, &stream, &history, &key, i as u64)
                .await
                .then_some(())
        }
    })
    .await;
    for (n, key) in keys.iter().cycle().take(200).enumerate() {
        assert!(publish_key(&env.conn, &env.stream, &history, key, 5000 + n as u64).await);
    }
    wait_all_handled(&history, "the records after the failover to be handled").await;
    let resumed_in = after_takeover.elapsed();
    wait_reader_on(&env.cluster, replica, "a", shard).await;
    history.assert_holds();
    println!(
        "cluster failover: replica promoted {} ms after the kill; {} records after it handled within {} ms ({before} \
         before)",
        promoted_in.as_millis(),
        history.publishes().len() - before,
        resumed_in.as_millis()
    );
    a.close().await.expect("a closes");
}

/// A stream growing 4 -> 8 shards on the cluster while a keyed producer (the SDK, fenced publish) writes and two
/// consumers read: the coordinator seals the old shards, the group reads the new ones only after draining the old,
/// and every key keeps its order across shards (`cross_shard_order`), on top of the usual rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_grows_on_the_cluster_and_keys_keep_their_order_across_shards() {
    init_tracing();
    let cluster = RedisCluster::start().await;
    let coord = Coord::start(&target(&cluster)).await;
    let stream = StreamName::new("cgrow-stream").unwrap();
    let group = GroupName::new("cgrow-group").unwrap();
    coord
        .coordinator()
        .create_group(
            &stream,
            &group,
            &CreateGroupRequest {
                shard_count: Some(4),
                timings: Some(timings()),
            },
        )
        .await
        .expect("group created");
    let history = History::new();
    let spawn = |member: &str| {
        let builder = consumer_builder(&stream, &group, member, vec![coord.url()], target(&cluster));
        Scenario::spawn_with(builder, member, &history, &Gate::open())
    };
    let (a, b) = (spawn("a"), spawn("b"));
    let producer = Arc::new(
        Producer::builder(stream.as_str())
            .coordinator(coord.url())
            .redis(target(&cluster))
            .coordinator_timeout(Duration::from_millis(400))
            .refresh_retry(Duration::from_millis(20), Duration::from_millis(200))
            .build()
            .expect("producer configuration"),
    );
    producer.ready().await.expect("producer ready");

    // One sequential keyed publisher: each key's acknowledged order is its order.
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (producer, history, stop) = (Arc::clone(&producer), history.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let (mut i, mut refused) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let key = format!("key-{}", i % 32);
                let n = i.to_string();
                match producer.send(&key, &[("key", key.as_str()), ("n", n.as_str())]).await {
                    Ok(p) => {
                        history.published(Some(&key), &p);
                        i += 1;
                    }
                    // Not written or unknown: the same record again, so the key's order holds.
                    Err(_) => refused += 1,
                }
                // Real time: the load's pace, as a producer process writes.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (i, refused)
        })
    };
    wait_written(&history, 300).await;
    let grown_at = Instant::now();
    let version = coord
        .coordinator()
        .add_shards(&stream, 4, None)
        .await
        .expect("add shards")
        .routing_version;
    producer.observe_routing_version(version);
    // Released: the group adopted 8 shards and every parent is drained (no reshard left in its metadata).
    let store = coord_server::store::Store::connect(&target(&cluster))
        .await
        .expect("cluster");
    wait_for(DEADLINE, "the group to drain the parents and read all 8 shards", || {
        let (store, stream, group) = (store.clone(), stream.clone(), group.clone());
        async move {
            let m = store.group_metadata(&stream, &group).await.ok()??;
            (m.shard_count == 8 && m.reshards.is_empty()).then_some(())
        }
    })
    .await;
    let released_in = grown_at.elapsed();
    wait_written(&history, history.publishes().len() + 300).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, refused) = publisher.await.expect("publisher");
    wait_all_handled(&history, "every record to be handled after the growth").await;
    history.assert_holds();
    let order = cross_shard_order(&history);
    assert!(
        order.violations.is_empty(),
        "per-key order across shards: {:?}",
        &order.violations[..order.violations.len().min(5)]
    );
    assert!(order.keys_moved > 0, "keys moved to the new shards");
    let masters: BTreeSet<usize> = {
        let mut m = BTreeSet::new();
        for shard in 0..8 {
            m.insert(cluster.owner_of_key(&keys::shard_stream(&stream, ShardId(shard))).await);
        }
        m
    };
    assert_eq!(masters.len(), 3, "the 8 shards are on every master");
    println!(
        "cluster growth 4 -> 8: {ok} records ({refused} sends refused and repeated), {} keys moved, parents drained \
         and children released {} ms after add-shards",
        order.keys_moved,
        released_in.as_millis()
    );
    a.close().await.expect("a closes");
    b.close().await.expect("b closes");
}
