//! Durable writes (issue 30) through the failures they are for: a failover that loses the writes its replica had
//! not received, and a Redis Cluster, where the `WAIT` must go to the master that took each write.
//!
//! * One server and its replica: a keyed load from a durable producer (`Durability::Replicas { min: 1 }`) and from
//!   a plain one (the control run), while the replica is cut off (`SIGSTOP`, then `CLIENT KILL TYPE replica` on the
//!   primary: it can neither receive nor reconnect), the primary is killed and the replica promoted. Every record
//!   the durable producer reported Written is on the promoted replica; the control run's Written records of the
//!   cut-off window are lost (the lag is provoked, so the loss is certain and asserted).
//! * A Redis Cluster: with one master's replica stopped, exactly the records of that master's shards come back
//!   `NotReplicated`; after a slot moved, the records follow `MOVED` to the new master, and so does their `WAIT`.
//!
//! Figures are printed; run with `--nocapture` to see them.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use protocol::routing::shard_for_key;
use protocol::ShardId;
use redis::Value;
use stream_producer::{
    BatchError, Durability, Producer, ProducerBuilder, PublishError, Published, Record, RecordOutcome,
};
use test_support::cluster::{key_slot, RedisCluster};
use test_support::{FaultProxy, Mode, RedisServer, ReplicaPair};

const SHARDS: u32 = 4;
const KEYS: u64 = 20;
const BATCH: u64 = 10;
/// The durable producers' `WAIT` timeout.
const WAIT: Duration = Duration::from_millis(400);

/// Sends `signal` (`STOP`, `CONT`) to `server`'s process.
fn signal(server: &RedisServer, signal: &str) {
    let pid = server.pid().expect("the server runs");
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Record `n` of producer `tag`: key `key-<n % KEYS>`, fields `p` (the tag), `key` and `n`.
fn record(tag: &str, n: u64) -> Record {
    let key = format!("key-{}", n % KEYS);
    Record::with_key(key.clone())
        .field("p", tag)
        .field("key", key)
        .field("n", n.to_string())
}

/// What a producer said about each of its records, by `n`.
#[derive(Debug, Default)]
struct Outcomes {
    written: BTreeMap<u64, Published>,
    not_written: u64,
    unknown: Vec<u64>,
    not_replicated: u64,
}

impl Outcomes {
    fn record(&mut self, first: u64, result: Result<Vec<Published>, BatchError>) {
        let outcomes = match result {
            Ok(published) => published.into_iter().map(RecordOutcome::Written).collect(),
            Err(e) => e.into_outcomes(),
        };
        for (i, o) in outcomes.into_iter().enumerate() {
            let n = first + i as u64;
            match o {
                RecordOutcome::Written(p) => {
                    self.written.insert(n, p);
                }
                RecordOutcome::NotWritten(_) => self.not_written += 1,
                RecordOutcome::Unknown(e) => {
                    self.not_replicated += u64::from(e.is_not_replicated());
                    self.unknown.push(n);
                }
            }
        }
    }
}

/// Live counts of a [`Load`], for the test to wait on.
#[derive(Debug, Default)]
struct Counts {
    written: AtomicU64,
    not_replicated: AtomicU64,
}

/// A keyed load: `send_batch` of [`BATCH`] records, one call at a time, until stopped.
struct Load {
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Outcomes>,
}

impl Load {
    fn spawn(producer: Arc<Producer>, tag: &'static str) -> Load {
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (counts, stop) = (counts.clone(), stop.clone());
            tokio::spawn(async move {
                let mut outcomes = Outcomes::default();
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    let result = producer
                        .send_batch((n..n + BATCH).map(|i| record(tag, i)).collect())
                        .await;
                    let failed_fast = result
                        .as_ref()
                        .is_err_and(|e| e.count(stream_producer::WriteState::Written) == 0);
                    outcomes.record(n, result);
                    counts.written.store(outcomes.written.len() as u64, Ordering::Release);
                    counts.not_replicated.store(outcomes.not_replicated, Ordering::Release);
                    n += BATCH;
                    if failed_fast {
                        // Pacing while Redis is away (connections refused at once), not a synchronisation.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                outcomes
            })
        };
        Load { counts, stop, task }
    }

    fn written(&self) -> u64 {
        self.counts.written.load(Ordering::Acquire)
    }

    fn not_replicated(&self) -> u64 {
        self.counts.not_replicated.load(Ordering::Acquire)
    }

    async fn stop(self) -> Outcomes {
        self.stop.store(true, Ordering::Release);
        self.task.await.expect("load task")
    }
}

/// Waits until `f` reaches `at_least`.
async fn wait_count(what: &str, at_least: u64, f: impl Fn() -> u64) {
    test_support::wait_until(DEADLINE, what, || {
        let ok = f() >= at_least;
        async move { ok }
    })
    .await;
}

/// Every entry of every shard stream on `server`: (producer tag, n) -> (shard, entry id).
async fn read_back(s: &Scenario, server: &RedisServer) -> HashMap<(String, u64), (u32, String)> {
    let mut con = server.connection().await;
    let mut out = HashMap::new();
    for shard in 0..s.shards {
        let entries: Vec<Value> = redis::cmd("XRANGE")
            .arg(s.shard_key(shard))
            .arg("-")
            .arg("+")
            .query_async(&mut con)
            .await
            .expect("XRANGE");
        for entry in entries {
            let (id, fields): (String, HashMap<String, String>) = redis::from_redis_value(entry).expect("an entry");
            let n = fields["n"].parse().expect("n is a number");
            out.insert((fields["p"].clone(), n), (shard, id));
        }
    }
    out
}

/// The Written records of `tag` that `stored` does not hold at the shard and id the producer reported.
fn lost(tag: &str, outcomes: &Outcomes, stored: &HashMap<(String, u64), (u32, String)>) -> Vec<u64> {
    outcomes
        .written
        .iter()
        .filter(|(n, p)| stored.get(&(tag.to_owned(), **n)) != Some(&(p.shard.0, p.id.to_string())))
        .map(|(n, _)| *n)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loses_no_record_a_durable_producer_reported_written() {
    let ReplicaPair { primary, replica } = ReplicaPair::start().await;
    let replica_addr = SocketAddr::from(([127, 0, 0, 1], replica.port()));
    // Producers reach Redis through an address the failover re-points (a Sentinel-aware client or a DNS name).
    let front = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], primary.port()))).await;
    let mut s = Scenario::on(primary, "durable-failover", SHARDS).await;
    let next = s.reserve_coordinator();
    let builder = || s.producer().redis(front.url());
    let durable = Arc::new(
        builder()
            .durability(Durability::replicas(1, WAIT))
            .build()
            .expect("valid configuration"),
    );
    let control = Arc::new(builder().build().expect("valid configuration"));
    let (d, c) = (
        Load::spawn(durable.clone(), "durable"),
        Load::spawn(control.clone(), "control"),
    );
    wait_count("durable records written with the replica up", 50, || d.written()).await;
    wait_count("control records written with the replica up", 50, || c.written()).await;

    // The replica is cut off: frozen, and its link closed, so it neither receives nor reconnects.
    signal(&replica, "STOP");
    let mut con = s.redis.connection().await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut con)
        .await
        .expect("CLIENT KILL TYPE replica");
    assert_eq!(killed, 1, "the replica's link");
    let cut = Instant::now();
    let (durable_at_cut, control_at_cut) = (d.written(), c.written());
    wait_count("durable batches unconfirmed while cut off", 2 * BATCH, || {
        d.not_replicated()
    })
    .await;
    wait_count(
        "control records written while cut off",
        control_at_cut + 3 * BATCH,
        || c.written(),
    )
    .await;
    let (durable_at_kill, control_at_kill) = (d.written(), c.written());

    // The primary dies with what only it had; the replica is promoted; coordinator and producers follow it.
    s.redis.kill();
    s.coords[0].abort();
    signal(&replica, "CONT");
    replica.promote().await;
    front.set_target(replica_addr);
    front.set_mode(Mode::Reset);
    front.set_mode(Mode::Pass);
    s.coords[next].restart_on(&replica.url()).await;
    let promoted = Instant::now();

    // The promoted replica has no replica of its own: durable writes are unconfirmed until one is attached.
    let not_replicated = d.not_replicated();
    wait_count(
        "durable batches unconfirmed on the promoted replica",
        not_replicated + BATCH,
        || d.not_replicated(),
    )
    .await;
    let _second = RedisServer::builder().replica_of(&replica).start().await;
    let (durable_before, control_before) = (d.written(), c.written());
    wait_count("durable records written again", durable_before + 5 * BATCH, || {
        d.written()
    })
    .await;
    wait_count(
        "control records written after the failover",
        control_before + 5 * BATCH,
        || c.written(),
    )
    .await;
    let (durable_out, control_out) = (d.stop().await, c.stop().await);

    let stored = read_back(&s, &replica).await;
    let (durable_lost, control_lost) = (
        lost("durable", &durable_out, &stored),
        lost("control", &control_out, &stored),
    );
    let present = |tag: &str, ns: &[u64]| {
        ns.iter()
            .filter(|n| stored.contains_key(&(tag.to_owned(), **n)))
            .count()
    };
    println!(
        "failover: durable {} written ({} lost), {} unknown ({} not replicated, {} present), {} not written; \
         control {} written ({} lost by the failover), {} unknown ({} present), {} not written; written while cut \
         off: durable {}, control {}; cut -> promoted {:?}, promoted -> end {:?}",
        durable_out.written.len(),
        durable_lost.len(),
        durable_out.unknown.len(),
        durable_out.not_replicated,
        present("durable", &durable_out.unknown),
        durable_out.not_written,
        control_out.written.len(),
        control_lost.len(),
        control_out.unknown.len(),
        present("control", &control_out.unknown),
        control_out.not_written,
        durable_at_kill - durable_at_cut,
        control_at_kill - control_at_cut,
        promoted.saturating_duration_since(cut),
        promoted.elapsed(),
    );
    assert!(
        durable_lost.is_empty(),
        "durable Written records lost: {durable_lost:?}"
    );
    // The control run lost what it wrote while the replica was cut off: at least two whole batches were sent
    // after the link was closed, and the primary died before the replica could have them (certain, not luck).
    assert!(
        control_lost.len() as u64 >= 2 * BATCH,
        "the control run lost {control_lost:?}"
    );
    for p in [durable, control] {
        Arc::into_inner(p).expect("the loads are done").close().await.unwrap();
    }
}

/// A coordinator on its own Redis serving the stream's routing, and a 3-master cluster (nodes 3, 4, 5 replicate
/// 0, 1, 2) holding the shard streams.
struct ClusterEnv {
    scenario: Scenario,
    cluster: RedisCluster,
}

const CLUSTER_SHARDS: u32 = 12;

impl ClusterEnv {
    async fn start(name: &str) -> ClusterEnv {
        let scenario = Scenario::start(name, CLUSTER_SHARDS).await;
        let cluster = RedisCluster::start_with_replicas().await;
        scenario.copy_shard_records(&mut cluster.connection().await).await;
        ClusterEnv { scenario, cluster }
    }

    fn producer(&self, path: &str) -> ProducerBuilder {
        let b = self
            .scenario
            .producer()
            .redis(format!("cluster:{}", self.cluster.urls().join(",")))
            .durability(Durability::replicas(1, WAIT));
        match path {
            "plain" => b.fencing(false),
            "fenced" => b,
            "idempotent" => b.idempotence(true),
            other => panic!("unknown path {other}"),
        }
    }

    /// The master (node index) serving each shard now.
    async fn owners(&self) -> Vec<usize> {
        let mut owners = Vec::new();
        for shard in 0..CLUSTER_SHARDS {
            owners.push(self.cluster.owner_of_key(&self.scenario.shard_key(shard)).await);
        }
        owners
    }
}

/// `n` records whose keys all route to `shard` (of [`CLUSTER_SHARDS`]), or to any shard when `None`.
fn cluster_records(shard: Option<u32>, n: usize) -> Vec<Record> {
    (0u64..)
        .map(|i| format!("key-{i}"))
        .filter(|k| shard.is_none_or(|s| shard_for_key(k.as_bytes(), CLUSTER_SHARDS) == ShardId(s)))
        .take(n)
        .map(|k| Record::with_key(k.clone()).field("p", "cluster").field("key", k))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_only_the_shards_of_the_master_whose_replica_stopped_are_unconfirmed() {
    let env = ClusterEnv::start("durable-cluster").await;
    let paths = ["plain", "fenced", "idempotent"];
    let producers: Vec<_> = paths.iter().map(|p| (*p, env.producer(p).build().unwrap())).collect();
    for (path, p) in &producers {
        p.send_batch(cluster_records(None, 60))
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    let owners = env.owners().await;
    let victim = owners[0];
    let replica = env.cluster.node(victim + 3).server();
    signal(replica, "STOP");
    for (path, p) in &producers {
        let started = Instant::now();
        let outcomes = match p.send_batch(cluster_records(None, 60)).await {
            Ok(_) => panic!("{path}: every record written"),
            Err(e) => e.into_outcomes(),
        };
        let took = started.elapsed();
        let (mut unconfirmed, mut written) = (0, 0);
        for (r, o) in cluster_records(None, 60).iter().zip(&outcomes) {
            let shard = shard_for_key(r.key().unwrap(), CLUSTER_SHARDS).0 as usize;
            if owners[shard] == victim {
                assert!(
                    matches!(
                        o.error(),
                        Some(PublishError::NotReplicated {
                            acked: 0,
                            required: 1,
                            ..
                        })
                    ),
                    "{path}: a record of shard {shard} on the stopped replica's master: {o:?}"
                );
                unconfirmed += 1;
            } else {
                assert!(o.published().is_some(), "{path}: shard {shard}: {o:?}");
                written += 1;
            }
        }
        println!("cluster {path}: {written} written, {unconfirmed} not replicated, in {took:?}");
        assert!(unconfirmed > 0 && written > 0);
        assert!(took >= WAIT, "{path}: {took:?}");
    }
    signal(replica, "CONT");
    for (path, p) in &producers {
        test_support::wait_for(DEADLINE, &format!("{path}: a batch written whole again"), || async {
            p.send_batch(cluster_records(None, 60)).await.ok()
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_wait_follows_moved_records_to_their_new_master() {
    let env = ClusterEnv::start("durable-moved").await;
    let shard = 0;
    for path in ["plain", "fenced"] {
        let producer = env.producer(path).build().unwrap();
        // Learn the slot map: the shard's batches go to its master.
        producer.send_batch(cluster_records(Some(shard), 20)).await.unwrap();
        let from = env.cluster.owner_of_key(&env.scenario.shard_key(shard)).await;
        let to = (from + 1) % 3;
        env.cluster
            .migrate_slot(key_slot(env.scenario.shard_key(shard).as_bytes()), to)
            .await;
        // (After the migration: the harness asks every node, a stopped one would not answer.)
        let to_replica = env.cluster.node(to + 3).server();
        signal(to_replica, "STOP");
        // The producer's map still names the old master: MOVED, then the records run on the new one, whose
        // replica is stopped. The WAIT that counts is the one behind them there.
        let e = producer.send_batch(cluster_records(Some(shard), 20)).await.unwrap_err();
        let stats = producer.stats();
        assert!(stats.redirects_moved > 0, "{path}: {stats:?}");
        assert_eq!(
            e.count(stream_producer::WriteState::Unknown),
            20,
            "{path}: {e}; {:?}",
            e.outcomes()
        );
        // The WAIT answered (a count, not an error): it was sent behind the records on the node that ran them.
        assert!(
            e.outcomes().iter().all(|o| matches!(
                o.error(),
                Some(PublishError::NotReplicated {
                    acked: 0,
                    required: 1,
                    source: None,
                    ..
                })
            )),
            "{path}: {:?}",
            e.outcomes()
        );
        signal(to_replica, "CONT");
        test_support::wait_for(DEADLINE, &format!("{path}: written on the new master"), || async {
            producer.send_batch(cluster_records(Some(shard), 20)).await.ok()
        })
        .await;
        // Moved once more, every replica running: the redirected records are confirmed there, Written.
        let third = (to + 1) % 3;
        env.cluster
            .migrate_slot(key_slot(env.scenario.shard_key(shard).as_bytes()), third)
            .await;
        let moved = producer.stats().redirects_moved;
        producer
            .send_batch(cluster_records(Some(shard), 20))
            .await
            .unwrap_or_else(|e| panic!("{path}: after MOVED with a running replica: {e}"));
        assert!(producer.stats().redirects_moved > moved, "{path}: redirected");
        println!(
            "moved ({path}): {} commands re-sent after MOVED",
            producer.stats().redirects_moved
        );
    }
}
