//! `--cluster`: the raw cluster loop against the SDK modes on a local 3-master Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use protocol::names::StreamName;
use protocol::routing::shard_for_key;
use redis::cluster_async::ClusterConnection;
use stream_producer::{Durability, Producer};

use crate::args::Args;
use crate::measure::{load_average, median, process_cpu, rate, redis_cpu};
use crate::modes::SDK_MODES;
use crate::raw::{timed_tasks, Claims, Workload};
use crate::sdk::{bench_producer, sdk_batch_run, sdk_enqueue_run};
use benches::group::coordinator as bench_coordinator;

/// `--sdk-tasks` tasks each taking `--sdk-batch` records, grouping them by shard and sending every shard's
/// pipeline of `XADD`s concurrently through one shared redis-rs cluster connection.
pub(crate) async fn raw_cluster_run(
    con: &redis::cluster_async::ClusterConnection,
    args: &Args,
    work: &Arc<Workload>,
) -> Result<Duration> {
    let n = work.keys.len();
    let batch = args.sdk_batch;
    let claims = Claims::new(n, batch);
    timed_tasks(args.sdk_tasks, |_| {
        let (con, work, claims) = (con.clone(), work.clone(), claims.clone());
        async move {
            let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); work.shards as usize];
            while let Some(range) = claims.next() {
                by_shard.iter_mut().for_each(Vec::clear);
                for i in range {
                    by_shard[shard_for_key(work.keys[i].as_bytes(), work.shards).index()].push(i);
                }
                let sends = by_shard
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| !r.is_empty())
                    .map(|(shard, records)| {
                        let mut con = con.clone();
                        let mut pipe = redis::pipe();
                        for _ in records {
                            pipe.cmd("XADD")
                                .arg(work.shard_keys[shard].as_str())
                                .arg("*")
                                .arg("p")
                                .arg(work.payload.as_slice());
                        }
                        let expected = records.len();
                        async move {
                            let replies: Vec<redis::Value> = pipe.query_async(&mut con).await?;
                            ensure!(
                                replies.len() == expected,
                                "{} replies to {expected} XADDs",
                                replies.len()
                            );
                            Ok(())
                        }
                    });
                for r in futures::future::join_all(sends).await {
                    r?;
                }
            }
            Ok(())
        }
    })
    .await
}

/// One sample of a mode: records/s, client CPU and Redis CPU (both in us per record).
type ClusterSample = (f64, f64, f64);

/// What every round of the `--cluster` run needs.
struct ClusterBench<'a> {
    args: &'a Args,
    work: Arc<Workload>,
    /// A cluster connection for the raw loop and the entry counts.
    con: ClusterConnection,
    /// A connection to every master, for the Redis CPU.
    masters: Vec<redis::aio::MultiplexedConnection>,
    /// The producers of the send_batch modes (the enqueue modes use the matching one).
    producers: [(&'static str, Arc<Producer>); 3],
}

/// The `--cluster` run (see the module docs).
pub(crate) async fn cluster_main(args: Args) -> Result<()> {
    use test_support::cluster::RedisCluster;
    let cluster = RedisCluster::start().await;
    let stream = StreamName::new("bench")?;
    let target = format!("cluster:{}", cluster.urls().join(","));
    // On the cluster itself: the shard records a fenced write checks live with the shards (issue 30).
    let coordinator = bench_coordinator(&target, &stream, args.shards).await?;
    let url = coordinator.url();
    let build = |fencing: bool, idempotence: bool| {
        bench_producer(
            &args,
            &stream,
            (url.as_str(), target.as_str()),
            (fencing, idempotence),
            Durability::Primary,
        )
    };
    let producers = [
        ("sdk-batch", build(true, false)?),
        ("sdk-plain", build(false, false)?),
        ("sdk-idem", build(true, true)?),
    ];
    for (_, p) in &producers {
        p.ready().await?;
    }
    let con = cluster.connection().await;
    let mut masters = Vec::new();
    for m in cluster.masters().await {
        masters.push(cluster.node(m).server().connection().await);
    }
    let work = Arc::new(Workload::new(&args, &stream));
    let mut shards_per_master = std::collections::BTreeMap::new();
    for key in &work.shard_keys {
        *shards_per_master
            .entry(cluster.owner_of_key(key).await)
            .or_insert(0usize) += 1;
    }
    println!(
        "cluster of 3 masters (shards per master {shards_per_master:?}); {} records of {} B payload, {} keys, {} \
         shards; {} tasks, send_batch of {} (raw-cluster: the same batches, one pipeline per shard); sdk {} \
         connections per master",
        args.records, args.payload_bytes, args.keys, args.shards, args.sdk_tasks, args.sdk_batch, args.sdk_connections
    );
    let modes = cluster_modes(&args)?;
    let bench = ClusterBench {
        args: &args,
        work,
        con,
        masters,
        producers,
    };
    let mut samples: Vec<Vec<ClusterSample>> = vec![Vec::new(); modes.len()];
    for round in 1..=args.rounds {
        for (mode, samples) in modes.iter().zip(&mut samples) {
            samples.push(bench.round(round, mode).await?);
        }
    }
    print_cluster_summary(&args, &modes, &samples);
    for (_, p) in bench.producers {
        Arc::into_inner(p).context("all tasks finished")?.close().await?;
    }
    coordinator.shutdown().await;
    Ok(())
}

/// raw-cluster, then the SDK modes of `--modes` (the durable ones need a replica, which this run has not).
fn cluster_modes(args: &Args) -> Result<Vec<&'static str>> {
    let mut modes: Vec<&'static str> = vec!["raw-cluster"];
    for name in &args.modes {
        match SDK_MODES.iter().find(|(m, _)| m == name) {
            Some((m, _)) if m.contains("durable") => bail!("{m}: the durable modes run on one server with --replica"),
            Some((m, _)) => modes.push(*m),
            None if name == "raw" => {}
            None => bail!("unknown mode {name:?}"),
        }
    }
    Ok(modes)
}

impl ClusterBench<'_> {
    /// The producer of `mode`: the enqueue modes use the producers of the matching send_batch modes.
    fn producer_of(&self, mode: &str) -> Option<&Arc<Producer>> {
        let name = match mode {
            "sdk-enqueue" => "sdk-batch",
            "sdk-enqueue-idem" => "sdk-idem",
            "sdk-enqueue-plain" => "sdk-plain",
            other => other,
        };
        self.producers.iter().find(|(m, _)| *m == name).map(|(_, p)| p)
    }

    /// Deletes every shard stream; answers how many entries they held.
    async fn clear(&self) -> Result<u64> {
        let mut con = self.con.clone();
        let mut total = 0u64;
        for key in &self.work.shard_keys {
            total += redis::cmd("XLEN").arg(key).query_async::<u64>(&mut con).await?;
            let () = redis::cmd("DEL").arg(key).query_async(&mut con).await?;
        }
        Ok(total)
    }

    /// CPU seconds used by every master.
    async fn redis_cpu_sum(&self) -> Result<f64> {
        let mut masters = self.masters.clone();
        let mut sum = 0.0;
        for m in &mut masters {
            sum += redis_cpu(m).await?;
        }
        Ok(sum)
    }

    /// One round of `mode`: cleared streams, the timed run, the entries counted, the costs; printed.
    async fn round(&self, round: usize, mode: &str) -> Result<ClusterSample> {
        let args = self.args;
        self.clear().await?;
        let redis_before = self.redis_cpu_sum().await?;
        let (cpu_before, _) = process_cpu();
        let took = match mode {
            "raw-cluster" => raw_cluster_run(&self.con, args, &self.work).await?,
            name => {
                let p = self.producer_of(name).context("a mode")?;
                if name.starts_with("sdk-enqueue") {
                    sdk_enqueue_run(p, args, &self.work).await?
                } else {
                    sdk_batch_run(p, args, &self.work).await?
                }
            }
        };
        let (cpu_after, _) = process_cpu();
        let redis_after = self.redis_cpu_sum().await?;
        let written = self.clear().await?;
        ensure!(
            written == args.records as u64,
            "{mode}: {written} entries written, expected {}",
            args.records
        );
        let per_record = 1e6 / args.records as f64;
        let sample = (
            rate(args.records, took),
            (cpu_after - cpu_before) * per_record,
            (redis_after - redis_before) * per_record,
        );
        println!(
            "round {round} {mode:<12} {:>8.0} records/s ({took:.2?})  client {:.2} us/rec  redis {:.2} us/rec  \
             load {}",
            sample.0,
            sample.1,
            sample.2,
            load_average()
        );
        Ok(sample)
    }
}

/// The table of medians, with each mode's ratio to raw-cluster.
fn print_cluster_summary(args: &Args, modes: &[&str], samples: &[Vec<ClusterSample>]) {
    let med = |s: &[ClusterSample], f: fn(&ClusterSample) -> f64| median(&s.iter().map(f).collect::<Vec<_>>());
    let baseline = med(&samples[0], |s| s.0);
    println!();
    println!(
        "medians of {} interleaved rounds, {} records each, 3-master cluster:",
        args.rounds, args.records
    );
    println!();
    println!(
        "| mode | median records/s | min - max | ratio to raw-cluster | client CPU us/record | Redis CPU us/record |"
    );
    println!("|---|---|---|---|---|---|");
    for (mode, s) in modes.iter().zip(samples) {
        let r = med(s, |s| s.0);
        let min = s.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
        let max = s.iter().map(|s| s.0).fold(0.0, f64::max);
        println!(
            "| {mode} | {r:.0} | {min:.0} - {max:.0} | {:.3} | {:.2} | {:.2} |",
            r / baseline,
            med(s, |s| s.1),
            med(s, |s| s.2)
        );
    }
}
