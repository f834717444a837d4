//! Redis Cluster, issue 15: the producer SDK on a local cluster (`cluster:` target), writing each shard's pipeline
//! straight to the master of the shard's slot and following `MOVED` / `ASK` / `TRYAGAIN` / `CLUSTERDOWN` per
//! command, with the Written / NotWritten / Unknown contract kept exact.
//!
//! The coordinator keeps its metadata on a single Redis of its own (the routing it serves is all the producer
//! needs from it); the shard streams live on the cluster. Every record carries a unique number `n` and its key;
//! the checks read every shard stream back from the cluster:
//! - a Written record is in its shard stream exactly once, at the entry id the producer reported;
//! - a NotWritten record is in no stream;
//! - an Unknown record is in at most once;
//! - per key, the numbers in a shard stream increase (the producer sends one batch at a time per test).
//!
//! Figures (records, commands re-sent after `ASK` / `MOVED` / retries, recovery after a failover) are printed;
//! run with `--nocapture` to see them.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::*;
use protocol::keys;
use protocol::names::StreamName;
use protocol::routing::shard_for_key;
use protocol::ShardId;
use redis::{RedisResult, Value};
use stream_producer::{ConfigError, Producer, ProducerBuilder, Published, Record, RecordOutcome};
use test_support::cluster::{key_slot, RedisCluster};

const SHARDS: u32 = 12;
const KEYS: u64 = 40;

/// How a producer publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain pipelined `XADD`s (`fencing(false)`).
    Plain,
    /// The fenced publish script (the default).
    Fenced,
    /// The idempotent producer.
    Idempotent,
}

/// A coordinator on its own Redis serving the stream's routing, and the cluster holding the shard streams.
struct Env {
    scenario: Scenario,
    cluster: RedisCluster,
}

impl Env {
    async fn start(name: &str, cluster: RedisCluster) -> Env {
        let scenario = Scenario::start(name, SHARDS).await;
        scenario.copy_shard_records(&mut cluster.connection().await).await;
        Env { scenario, cluster }
    }

    fn target(&self) -> String {
        format!("cluster:{}", self.cluster.urls().join(","))
    }

    fn stream(&self) -> &StreamName {
        &self.scenario.stream
    }

    fn producer(&self, mode: Mode) -> ProducerBuilder {
        let b = self.scenario.producer().redis(self.target());
        match mode {
            Mode::Plain => b.fencing(false),
            Mode::Fenced => b,
            Mode::Idempotent => b.idempotence(true),
        }
    }

    fn shard_key(&self, shard: u32) -> String {
        keys::shard_stream(self.stream(), ShardId(shard))
    }

    /// Every entry of every shard stream: shard -> [(entry id, key, n)] in stream order.
    async fn read_back(&self) -> BTreeMap<u32, Vec<(String, String, u64)>> {
        let mut con = self.cluster.connection().await;
        let mut out = BTreeMap::new();
        for shard in 0..SHARDS {
            let entries: Vec<Value> = redis::cmd("XRANGE")
                .arg(self.shard_key(shard))
                .arg("-")
                .arg("+")
                .query_async(&mut con)
                .await
                .expect("XRANGE");
            let mut rows = Vec::with_capacity(entries.len());
            for entry in entries {
                let (id, fields): (String, HashMap<String, String>) = redis::from_redis_value(entry).expect("an entry");
                let n = fields["n"].parse().expect("n is a number");
                rows.push((id, fields["key"].clone(), n));
            }
            out.insert(shard, rows);
        }
        out
    }
}

fn record(n: u64) -> Record {
    let key = format!("key-{}", n % KEYS);
    Record::with_key(key.clone())
        .field("key", key)
        .field("n", n.to_string())
}

/// What the producer said about every record, by `n`.
#[derive(Default)]
struct Outcomes {
    written: BTreeMap<u64, Published>,
    not_written: BTreeSet<u64>,
    unknown: BTreeSet<u64>,
}

impl Outcomes {
    fn record_batch(&mut self, first: u64, result: Result<Vec<Published>, stream_producer::BatchError>) {
        match result {
            Ok(published) => {
                for (i, p) in published.into_iter().enumerate() {
                    self.written.insert(first + i as u64, p);
                }
            }
            Err(e) => {
                for (i, o) in e.into_outcomes().into_iter().enumerate() {
                    let n = first + i as u64;
                    match o {
                        RecordOutcome::Written(p) => {
                            self.written.insert(n, p);
                        }
                        RecordOutcome::NotWritten(_) => {
                            self.not_written.insert(n);
                        }
                        RecordOutcome::Unknown(_) => {
                            self.unknown.insert(n);
                        }
                    }
                }
            }
        }
    }

    fn total(&self) -> usize {
        self.written.len() + self.not_written.len() + self.unknown.len()
    }
}

/// What the streams hold compared with what the producer said.
#[derive(Debug, Default)]
struct Check {
    records: usize,
    written: usize,
    not_written: usize,
    unknown: usize,
    unknown_present: usize,
    /// Written records missing from their stream (only a failover may lose them).
    lost: Vec<u64>,
}

/// Checks the contract; `may_lose` allows Written records to be missing (a lossy failover), counting them;
/// `per_key_order`: the records were published one call at a time, so each key's must be in order.
fn check(
    env_stream: &BTreeMap<u32, Vec<(String, String, u64)>>,
    outcomes: &Outcomes,
    may_lose: bool,
    per_key_order: bool,
) -> Check {
    let mut seen: HashMap<u64, Vec<(u32, String)>> = HashMap::new();
    for (shard, rows) in env_stream {
        let mut last_of_key: HashMap<&str, u64> = HashMap::new();
        for (id, key, n) in rows {
            seen.entry(*n).or_default().push((*shard, id.clone()));
            assert_eq!(
                shard_for_key(key.as_bytes(), SHARDS),
                ShardId(*shard),
                "record {n} of {key} is on shard {shard}"
            );
            if let Some(prev) = last_of_key.insert(key, *n).filter(|_| per_key_order) {
                assert!(prev < *n, "order of {key} on shard {shard}: {prev} before {n}");
            }
        }
    }
    let mut c = Check {
        records: outcomes.total(),
        written: outcomes.written.len(),
        not_written: outcomes.not_written.len(),
        unknown: outcomes.unknown.len(),
        ..Check::default()
    };
    for (n, p) in &outcomes.written {
        match seen.get(n).map(Vec::as_slice) {
            None | Some([]) if may_lose => c.lost.push(*n),
            None | Some([]) => {
                let rows = env_stream.get(&p.shard.0).map_or(&[][..], Vec::as_slice);
                let at_its_id = rows.iter().find(|(id, _, _)| *id == p.id.to_string());
                panic!(
                    "written record {n} ({p:?}) is in no stream; its shard holds {} entries ({:?} .. {:?}), at its \
                     id: {at_its_id:?}",
                    rows.len(),
                    rows.first(),
                    rows.last()
                )
            }
            Some([(shard, id)]) => {
                assert_eq!((ShardId(*shard), id.clone()), (p.shard, p.id.to_string()), "record {n}");
            }
            Some(many) => panic!("written record {n} is in the streams {} times: {many:?}", many.len()),
        }
    }
    for n in &outcomes.not_written {
        assert!(
            !seen.contains_key(n),
            "not-written record {n} is in a stream: {:?}",
            seen[n]
        );
    }
    for n in &outcomes.unknown {
        let times = seen.get(n).map_or(0, Vec::len);
        assert!(times <= 1, "unknown record {n} is in the streams {times} times");
        c.unknown_present += times;
    }
    let reported: BTreeSet<u64> = outcomes
        .written
        .keys()
        .chain(&outcomes.not_written)
        .chain(&outcomes.unknown)
        .copied()
        .collect();
    for n in seen.keys() {
        assert!(
            reported.contains(n),
            "record {n} is in a stream but was never published"
        );
    }
    c
}

/// The masters the shard streams of the stream live on.
async fn masters_of_shards(env: &Env) -> BTreeSet<usize> {
    let mut masters = BTreeSet::new();
    for shard in 0..SHARDS {
        masters.insert(env.cluster.owner_of_key(&env.shard_key(shard)).await);
    }
    masters
}

#[tokio::test]
async fn a_bad_cluster_target_is_refused_at_build() {
    let build = |target: &str| {
        Producer::builder("orders")
            .coordinator("http://127.0.0.1:7400")
            .redis(target)
            .build()
    };
    for bad in [
        "cluster:",
        "cluster:redis://a:1,,redis://b:2",
        "cluster:http://a:1",
        "cluster:redis://a:1/2",
    ] {
        match build(bad) {
            Err(ConfigError::InvalidRedisTarget(_)) => {}
            other => panic!("{bad}: {other:?}"),
        }
    }
    let ok = build("cluster:redis://10.0.0.1:7000, redis://:pw@10.0.0.2:7001").expect("a valid cluster target");
    assert!(ok.config().is_cluster());
    assert!(!format!("{:?}", ok.config()).contains("pw"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_batch_and_enqueue_write_every_record_once_on_every_master() {
    let env = Env::start("clprod", RedisCluster::start().await).await;
    assert_eq!(masters_of_shards(&env).await.len(), 3, "the shards are on every master");
    let mut outcomes = Outcomes::default();
    let mut n = 0u64;
    for mode in [Mode::Plain, Mode::Fenced, Mode::Idempotent] {
        let producer = env.producer(mode).build().expect("valid configuration");
        producer.ready().await.expect("ready on the cluster");
        for _ in 0..4 {
            let batch: Vec<Record> = (n..n + 150).map(record).collect();
            let result = producer.send_batch(batch).await;
            assert!(result.is_ok(), "{mode:?}: {:?}", result.as_ref().err());
            outcomes.record_batch(n, result);
            n += 150;
        }
        let mut deliveries = Vec::new();
        for i in n..n + 400 {
            deliveries.push((i, producer.enqueue(record(i)).await.expect("accepted")));
        }
        n += 400;
        for (i, d) in deliveries {
            let p = d.await.unwrap_or_else(|e| panic!("{mode:?}: enqueued record {i}: {e}"));
            outcomes.written.insert(i, p);
        }
        let stats = producer.close().await.expect("closed");
        assert_eq!(stats.records_written, 1000, "{mode:?}: {stats:?}");
        assert_eq!(
            stats.redirects_moved + stats.redirects_ask + stats.cluster_retries,
            0,
            "{mode:?}: a stable cluster redirects nothing: {stats:?}"
        );
    }
    let streams = env.read_back().await;
    let c = check(&streams, &outcomes, false, true);
    assert_eq!((c.written, c.not_written, c.unknown), (3000, 0, 0), "{c:?}");
    let per_master = {
        let mut m: BTreeMap<usize, usize> = BTreeMap::new();
        for (shard, rows) in &streams {
            *m.entry(env.cluster.owner_of_key(&env.shard_key(*shard)).await)
                .or_default() += rows.len();
        }
        m
    };
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    println!(
        "cluster producer: {} records written once each; per master {per_master:?}",
        c.written
    );
}

/// Publishes batches of 50 records, one batch at a time, until `stop`; every outcome goes to the shared record.
fn spawn_publisher(
    producer: Arc<Producer>,
    stop: Arc<AtomicBool>,
    batches: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Outcomes> {
    tokio::spawn(async move {
        let mut outcomes = Outcomes::default();
        let mut n = 0u64;
        while !stop.load(Ordering::Acquire) {
            let batch: Vec<Record> = (n..n + 50).map(record).collect();
            let result = producer.send_batch(batch).await;
            outcomes.record_batch(n, result);
            n += 50;
            batches.fetch_add(1, Ordering::Release);
        }
        outcomes
    })
}

/// Enqueues records one at a time (up to 400 deliveries outstanding, so up to `max_in_flight_batches` batches
/// of one shard are in flight together) until `stop`; `batches` counts settled deliveries / 50.
fn spawn_enqueuer(
    producer: Arc<Producer>,
    stop: Arc<AtomicBool>,
    batches: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Outcomes> {
    tokio::spawn(async move {
        let mut outcomes = Outcomes::default();
        let mut outstanding = std::collections::VecDeque::new();
        let settle = |outcomes: &mut Outcomes, n: u64, r: Result<Published, stream_producer::PublishError>| match r {
            Ok(p) => {
                outcomes.written.insert(n, p);
            }
            Err(e) if e.write_state() == stream_producer::WriteState::Unknown => {
                outcomes.unknown.insert(n);
            }
            Err(_) => {
                outcomes.not_written.insert(n);
            }
        };
        let mut n = 0u64;
        while !stop.load(Ordering::Acquire) {
            outstanding.push_back((n, producer.enqueue(record(n)).await.expect("accepted")));
            n += 1;
            if outstanding.len() > 400 {
                let (i, d) = outstanding.pop_front().expect("not empty");
                settle(&mut outcomes, i, d.await);
                if i % 50 == 49 {
                    batches.fetch_add(1, Ordering::Release);
                }
            }
        }
        for (i, d) in outstanding {
            settle(&mut outcomes, i, d.await);
        }
        outcomes
    })
}

async fn wait_batches(batches: &AtomicU64, at_least: u64, what: &str) {
    test_support::wait_until(DEADLINE, what, || {
        let done = batches.load(Ordering::Acquire) >= at_least;
        async move { done }
    })
    .await;
}

async fn migration_during_send_batch(name: &str, mode: Mode) {
    migration_during_publishing(name, mode, false).await;
}

async fn migration_during_publishing(name: &str, mode: Mode, enqueue: bool) {
    let env = Env::start(name, RedisCluster::start().await).await;
    let producer = env.producer(mode).max_batch_size(50).max_in_flight_batches(8);
    let producer = Arc::new(producer.build().expect("valid configuration"));
    producer.ready().await.expect("ready");
    // The busy shard: its slot moves to another master while batches keep coming (every batch writes to it:
    // 50 records over 40 keys and 12 shards).
    let shard = 0;
    let slot = key_slot(env.shard_key(shard).as_bytes());
    let from = env.cluster.owner_of_slot(slot).await;
    let to = (from + 1) % 3;
    let (stop, batches) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let publisher = if enqueue {
        spawn_enqueuer(producer.clone(), stop.clone(), batches.clone())
    } else {
        spawn_publisher(producer.clone(), stop.clone(), batches.clone())
    };
    wait_batches(&batches, 5, "five batches before the migration").await;

    let started = Instant::now();
    let migration = env.cluster.begin_migration(slot, to).await;
    // While the slot is migrating and its keys are still on the source: a batch or a redirect.
    let (b, s) = (batches.load(Ordering::Acquire), producer.stats());
    let busy = s.redirects_ask + s.cluster_retries;
    test_support::wait_until(DEADLINE, "a batch or a redirect while migrating", || {
        let s = producer.stats();
        let moved_on = batches.load(Ordering::Acquire) >= b + 2 || s.redirects_ask + s.cluster_retries > busy;
        async move { moved_on }
    })
    .await;
    let mut keys_moved = 0;
    loop {
        let n = migration.move_keys(10).await;
        if n == 0 {
            break;
        }
        keys_moved += n;
    }
    // The keys are on the target now: the source answers ASK for them.
    test_support::wait_until(DEADLINE, "an ASK", || {
        let asked = producer.stats().redirects_ask > 0;
        async move { asked }
    })
    .await;
    migration.finish().await;
    let migrated_in = started.elapsed();
    // The producer's slot map still names the source: the next pipeline of the shard is answered MOVED.
    test_support::wait_until(DEADLINE, "a MOVED", || {
        let moved = producer.stats().redirects_moved > 0;
        async move { moved }
    })
    .await;
    let after = batches.load(Ordering::Acquire);
    wait_batches(&batches, after + 5, "five batches after the migration").await;
    stop.store(true, Ordering::Release);
    let outcomes = publisher.await.expect("publisher");
    assert_eq!(env.cluster.owner_of_slot(slot).await, to, "the slot moved");

    // Printed before the check, so that a failure shows it: where the slot's keys are (a key left on a node that
    // no longer serves the slot is unreachable), and how long the nodes took to agree.
    let mut keys_per_node = Vec::new();
    for node in env.cluster.nodes() {
        let mut con = node.server().connection().await;
        let n: RedisResult<i64> = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query_async(&mut con)
            .await;
        keys_per_node.push(n.map_or_else(|e| e.to_string(), |n| n.to_string()));
    }
    println!("slot {slot} moved from node {from} to {to} in {migrated_in:?}; its keys per node: {keys_per_node:?}");
    let c = check(&env.read_back().await, &outcomes, false, !enqueue);
    let stats = producer.stats();
    println!(
        "slot migration ({mode:?}{}): {} records, {} written, {} not written, {} unknown ({} of them present); \
         {keys_moved} keys moved in {migrated_in:?}; commands re-sent after ASK {}, after MOVED {}, after \
         TRYAGAIN/CLUSTERDOWN {}",
        if enqueue { ", enqueue" } else { "" },
        c.records,
        c.written,
        c.not_written,
        c.unknown,
        c.unknown_present,
        stats.redirects_ask,
        stats.redirects_moved,
        stats.cluster_retries
    );
    assert!(stats.redirects_ask > 0 && stats.redirects_moved > 0, "{stats:?}");
    if mode == Mode::Idempotent {
        assert_eq!(
            (c.not_written, c.unknown),
            (0, 0),
            "idempotent: everything written: {c:?}"
        );
    }
    // A migration with every node up loses no connection: nothing is unknown, and every command sent again
    // after a redirect ran once.
    assert_eq!(c.unknown, 0, "{c:?}");
    assert_eq!(c.written, c.records - c.not_written);
    assert!(c.written > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_during_send_batch_keeps_outcomes_exact_plain() {
    migration_during_send_batch("clmig-plain", Mode::Plain).await;
}

/// Several batches of the migrating shard in flight at once (the batching mode, 8 batches in flight): outcomes
/// stay exact while concurrent pipelines of the shard are redirected together. Per-key order is not checked: with
/// several calls in flight the producer does not promise it (docs/producer.md, "Order"), and the batching mode
/// with 8 batches in flight does reorder some records of a key on one server too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_during_enqueue_keeps_outcomes_exact_plain() {
    migration_during_publishing("clmig-enq", Mode::Plain, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_during_send_batch_keeps_outcomes_exact_fenced() {
    migration_during_send_batch("clmig-fenced", Mode::Fenced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_during_send_batch_keeps_outcomes_exact_idempotent() {
    migration_during_send_batch("clmig-idem", Mode::Idempotent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_that_does_not_settle_fails_not_written_within_the_response_timeout() {
    let env = Env::start("clunsettled", RedisCluster::start().await).await;
    let timeout = std::time::Duration::from_millis(600);
    let producer = env
        .producer(Mode::Fenced)
        .redis_response_timeout(timeout)
        .build()
        .expect("valid configuration");
    producer.ready().await.expect("ready");
    let shard = 0;
    let slot = key_slot(env.shard_key(shard).as_bytes());
    let mut outcomes = Outcomes::default();
    outcomes.record_batch(0, producer.send_batch((0..100).map(record).collect()).await);
    assert_eq!(outcomes.written.len(), 100);

    // A migration left half-way: the shard's script calls (their fence key exists on neither node) are answered
    // ASK by the source and TRYAGAIN by the target until it ends.
    let from = env.cluster.owner_of_slot(slot).await;
    let migration = env.cluster.begin_migration(slot, (from + 1) % 3).await;
    while migration.move_keys(10).await > 0 {}
    let started = Instant::now();
    let result = producer.send_batch((100..200).map(record).collect()).await;
    let took = started.elapsed();
    let e = result.as_ref().expect_err("the shard's records cannot be written");
    let on_shard: Vec<u64> = (100..200)
        .filter(|n| shard_for_key(record(*n).key().unwrap(), SHARDS) == ShardId(shard))
        .collect();
    assert!(!on_shard.is_empty());
    assert_eq!(e.count(stream_producer::WriteState::NotWritten), on_shard.len(), "{e}");
    for n in &on_shard {
        let outcome = &e.outcomes()[(*n - 100) as usize];
        assert!(
            matches!(
                outcome.error(),
                Some(stream_producer::PublishError::ClusterUnsettled { .. })
            ),
            "record {n}: {outcome:?}"
        );
    }
    assert!(took >= timeout / 2 && took < timeout * 4, "gave up after {took:?}");
    outcomes.record_batch(100, result);

    migration.finish().await;
    let result = producer.send_batch((200..300).map(record).collect()).await;
    assert!(result.is_ok(), "{:?}", result.err());
    outcomes.record_batch(200, result);
    let c = check(&env.read_back().await, &outcomes, false, true);
    assert_eq!(
        (c.written, c.not_written, c.unknown),
        (300 - on_shard.len(), on_shard.len(), 0),
        "{c:?}"
    );
    let stats = producer.stats();
    println!(
        "unsettled slot: {} records of shard {shard} not written after {took:?} (response timeout {timeout:?}); {stats:?}",
        on_shard.len()
    );
}

/// Sends `signal` (`STOP` / `CONT`) to node `index`'s process.
fn signal(cluster: &RedisCluster, index: usize, signal: &str) {
    let pid = cluster.node(index).server().pid().expect("the node runs");
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// `lossy`: the replica is frozen (`SIGSTOP`) and its replication link cut before the master is killed, so the
/// records the master acknowledged since are lost by the `TAKEOVER`: the producer reported them Written, and the
/// test counts them (a Redis property, not the producer's: it cannot know).
async fn failover_during_publishing(name: &str, mode: Mode, lossy: bool) {
    let env = Env::start(name, RedisCluster::start_with_replicas().await).await;
    let producer = Arc::new(env.producer(mode).build().expect("valid configuration"));
    producer.ready().await.expect("ready");
    let shard = 0;
    let victim = env.cluster.owner_of_key(&env.shard_key(shard)).await;
    let replica = victim + 3;
    let (stop, batches) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let publisher = spawn_publisher(producer.clone(), stop.clone(), batches.clone());
    wait_batches(&batches, 10, "ten batches before the failover").await;

    let mut acked_unreplicated = 0;
    if lossy {
        signal(&env.cluster, replica, "STOP");
        let mut con = env.cluster.node(victim).server().connection().await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query_async(&mut con)
            .await
            .expect("CLIENT KILL TYPE replica");
        assert_eq!(killed, 1, "the replica's link");
        let (b, w) = (batches.load(Ordering::Acquire), producer.stats().records_written);
        wait_batches(&batches, b + 3, "three batches the replica does not get").await;
        acked_unreplicated = producer.stats().records_written - w;
    }
    let killed = Instant::now();
    env.cluster.kill(victim);
    if lossy {
        signal(&env.cluster, replica, "CONT");
    }
    env.cluster.wait_failing(victim).await;
    env.cluster.takeover(replica).await;
    let promoted = Instant::now();
    // Recovered once a batch issued after the takeover is written whole.
    let written_before = producer.stats().records_written;
    let after = batches.load(Ordering::Acquire);
    let recovered = test_support::wait_for(DEADLINE, "a whole batch written after the takeover", || {
        let s = producer.stats();
        let b = batches.load(Ordering::Acquire);
        let ok = (b >= after + 2 && s.records_written >= written_before + 100).then(Instant::now);
        async move { ok }
    })
    .await;
    wait_batches(&batches, batches.load(Ordering::Acquire) + 5, "five more batches").await;
    stop.store(true, Ordering::Release);
    let outcomes = publisher.await.expect("publisher");

    let c = check(&env.read_back().await, &outcomes, true, true);
    let stats = producer.stats();
    println!(
        "failover ({mode:?}{}): {} records, {} written ({} of them lost by the TAKEOVER), {} not written, {} unknown \
         ({} of them present); kill -> takeover done {:?}, takeover -> recovered {:?}; re-sent after MOVED {}, \
         ASK {}, retried {}",
        if lossy { ", lossy" } else { "" },
        c.records,
        c.written,
        c.lost.len(),
        c.not_written,
        c.unknown,
        c.unknown_present,
        promoted - killed,
        recovered.saturating_duration_since(promoted),
        stats.redirects_moved,
        stats.redirects_ask,
        stats.cluster_retries
    );
    assert!(c.written > 0);
    assert_eq!(c.written + c.not_written + c.unknown, c.records);
    if lossy {
        assert!(
            !c.lost.is_empty(),
            "records written while the replica was cut off are lost ({acked_unreplicated} acknowledged meanwhile)"
        );
    }
    // Only records of the failed master's shards can be lost.
    for n in &c.lost {
        let p = &outcomes.written[n];
        assert_eq!(
            env.cluster.owner_of_key(&env.shard_key(p.shard.0)).await,
            replica,
            "record {n} lost on shard {}",
            p.shard
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failover_during_publishing_keeps_outcomes_exact_fenced() {
    failover_during_publishing("clfo-fenced", Mode::Fenced, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failover_during_publishing_keeps_outcomes_exact_idempotent() {
    failover_during_publishing("clfo-idem", Mode::Idempotent, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_master_failover_counts_the_written_records_it_lost_fenced() {
    failover_during_publishing("clfol-fenced", Mode::Fenced, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_master_failover_counts_the_written_records_it_lost_idempotent() {
    failover_during_publishing("clfol-idem", Mode::Idempotent, true).await;
}
