//! Consumer benchmark (issue 7, item 1): the consumer SDK against a hand-written raw loop, over the same records,
//! in the same run, against one private `redis-server` (started through `test_support::RedisServer`) and an
//! in-process coordinator.
//!
//! ```text
//! cargo run --release -p benches --bin consumer_bench -- --records 400000 --payload-bytes 100
//! ```
//!
//! 1. `--records` entries (one field `p` of `--payload-bytes` bytes) are appended round-robin to the 8 shard
//!    streams (`protocol::keys::shard_stream`) with pipelined `XADD`s, once, before anything is measured.
//! 2. Every measured run reads *all* entries of the 8 shards through a Redis consumer group of its own (so every
//!    run reads the same records), and acknowledges every one of them:
//!    * raw: one task and one connection per shard; each round trip is one pipeline `XACK <the previous batch's
//!      ids>` + `XREADGROUP COUNT <count> STREAMS <shard> >`, until the shard is empty, then a last `XACK`. The
//!      reply is walked (ids kept, fields looked at) but not copied.
//!    * sdk-N: N `stream_consumer` members (batch size `<count>`, no-op handler that counts). The members join
//!      and settle (every shard read, none pending or revoking) while the Redis groups stand at the end of the
//!      streams (`XGROUP CREATE ... $`); then the clock starts, every group is moved to the beginning (`XGROUP
//!      SETID ... 0`) and one wake-up entry is appended per shard (the readers are blocked in `XREADGROUP`), so
//!      the run reads every record plus those 8. The clock stops when the handler has seen them all and no
//!      entry is pending (`XPENDING`), i.e. when the last `XACK` is in.
//! 3. Each mode runs `--rounds` times, interleaved (raw, sdk-1, sdk-4, raw, ...); the median rate of each mode
//!    is reported with its min and max, the ratio to the raw loop's median (goal, issue 17: >= 0.90) and the
//!    medians of client and Redis CPU per record (goal: the SDK's client CPU within 1.15x of the raw loop's;
//!    client CPU is this process's threads' time on a CPU in nanoseconds, `benches::cpu`, Redis's from `INFO`).
//!    The raw loop runs over every connection of `--raw-links` (redis-rs's multiplexed connection and parser;
//!    `redis_link::PipelinedConnection` with its own parser, about half the client CPU): the rate ratio is to
//!    the best median rate among them, the CPU ratio to the lowest client CPU among them. Memory: this
//!    process's `VmRSS` before each run and its peak during it (`VmHWM`, reset through `/proc/self/clear_refs`),
//!    of round 1 (the process also holds the coordinator and the members of the other modes' groups).
//!
//! `--cluster`: the same against a private local 3-master Redis Cluster (`test_support::cluster::RedisCluster`); the raw
//! loop's shard tasks then each use a redis-rs cluster connection (the strongest raw cluster client: it routes
//! every pipeline to the shard's master), the SDK gets the `cluster:` target, Redis CPU and command counts are
//! summed over the masters. On 2 cores the three masters share the cores with the client: the run shows what the
//! cluster paths cost, not node scaling.

mod args;
mod backend;
mod raw;
mod sdk;
mod summary;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use coord_server::server::CoordinatorHandle;
use protocol::names::StreamName;
use redis_link::Connection;

use crate::args::{Args, RawLink, SHARDS};
use crate::backend::{Backend, Nodes};
use crate::raw::{preload, raw_run, total_len};
use crate::sdk::{sdk_run, SdkEnv};
use crate::summary::{load_average, measured, rate, RunResult, Summary};

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let backend = Backend::start(args.cluster).await?;
    let mut con = backend.connection().await?;
    let mut nodes = Nodes::open(&backend).await?;
    let stream = StreamName::new("cbench")?;

    let mut config = coord_server::Config::new(backend.target());
    config.listen = "127.0.0.1:0".parse()?;
    // Short enough for the benchmark's 2.4 s lease (`Config::check_timings`).
    config.mutex_ttl = Duration::from_millis(1_200);
    config.critical_section_timeout = Duration::from_millis(1_000);
    let coordinator = CoordinatorHandle::spawn(config).await.context("coordinator")?;

    let payload = vec![b'x'; args.payload_bytes];
    let t = Instant::now();
    preload(&backend, &stream, args.records, &payload).await?;
    let loaded = total_len(&mut con, &stream).await?;
    ensure!(loaded == args.records as u64, "{loaded} entries loaded");
    println!(
        "{} records of {} B payload pre-loaded into {SHARDS} shards in {:.2?}; COUNT {} for both; \
         SDK members {:?}; {} interleaved rounds (medians reported); allocator {}",
        args.records,
        args.payload_bytes,
        t.elapsed(),
        args.count,
        args.members,
        args.rounds,
        benches::ALLOCATOR
    );

    let env = SdkEnv {
        coordinator: &coordinator,
        redis_url: backend.target(),
        stream: &stream,
        count: args.count,
    };
    // A cluster's raw loop has one kind of connection.
    let raw_links: Vec<RawLink> = if args.cluster {
        vec![RawLink::Multiplexed]
    } else {
        args.raw_links.clone()
    };
    let mut run = Rounds {
        args: &args,
        backend: &backend,
        con: &mut con,
        nodes: &mut nodes,
        stream: &stream,
        env: &env,
    };
    let (raw_runs, sdk_runs) = run.all(&raw_links).await?;
    print_table(&args, &raw_links, &raw_runs, &sdk_runs);
    coordinator.shutdown().await;
    drop(backend);
    Ok(())
}

/// What the interleaved rounds share.
struct Rounds<'a> {
    args: &'a Args,
    backend: &'a Backend,
    con: &'a mut Connection,
    nodes: &'a mut Nodes,
    stream: &'a StreamName,
    env: &'a SdkEnv<'a>,
}

impl Rounds<'_> {
    /// Every run of every mode, in round order: the raw runs of each link, the SDK runs of each member count.
    async fn all(&mut self, raw_links: &[RawLink]) -> Result<(Vec<Vec<RunResult>>, Vec<Vec<RunResult>>)> {
        let args = self.args;
        let mut raw_runs: Vec<Vec<RunResult>> = raw_links.iter().map(|_| Vec::new()).collect();
        let mut sdk_runs: Vec<Vec<RunResult>> = (0..args.members.len()).map(|_| Vec::new()).collect();
        for round in 1..=args.rounds {
            for (link, runs) in raw_links.iter().zip(&mut raw_runs).filter(|_| !args.no_raw) {
                runs.push(self.raw(round, *link).await?);
            }
            for (i, &members) in args.members.iter().enumerate().filter(|_| !args.no_sdk) {
                sdk_runs[i].push(self.sdk(round, members).await?);
            }
        }
        Ok((raw_runs, sdk_runs))
    }

    /// One raw run over `link`, printed.
    async fn raw(&mut self, round: usize, link: RawLink) -> Result<RunResult> {
        let group = format!("raw-{link:?}-r{round}");
        let run = measured(raw_run(
            self.backend,
            self.con,
            self.nodes,
            self.stream,
            &group,
            self.args.count,
            link,
        ))
        .await?;
        print_run(&format!("round {round} raw {:<21}", link.label()), &run);
        Ok(run)
    }

    /// One SDK run with `members` members, printed.
    async fn sdk(&mut self, round: usize, members: usize) -> Result<RunResult> {
        let group = format!("sdk{members}-r{round}");
        let run = measured(sdk_run(self.env, self.con, self.nodes, &group, members)).await?;
        let plural = if members == 1 { " " } else { "s" };
        print_run(&format!("round {round} sdk {members} member{plural}"), &run);
        Ok(run)
    }
}

/// One run's line: rate, records, time, cost and memory after `label`.
fn print_run(label: &str, run: &RunResult) {
    println!(
        "{label} {:>9.0} records/s ({} in {:.2?}; {}; {})",
        rate(run.records, run.took),
        run.records,
        run.took,
        run.cost.per_record(run.records),
        run.memory()
    );
}

/// The table of medians: each raw link and each SDK member count, with the ratios to the raw baselines.
fn print_table(args: &Args, raw_links: &[RawLink], raw_runs: &[Vec<RunResult>], sdk_runs: &[Vec<RunResult>]) {
    println!();
    println!(
        "## Consumer throughput ({} records, {} B payload, {SHARDS} shards, COUNT {}{}; medians of {} interleaved \
         rounds, load average {})",
        args.records,
        args.payload_bytes,
        args.count,
        if args.cluster { ", local 3-master cluster" } else { "" },
        args.rounds,
        load_average()
    );
    println!(
        "| run | median records/s | min - max | SDK / raw (goal >= 0.90) | client CPU/record | vs raw (goal <= 1.15) \
         | redis CPU/record | XREADGROUP + XACK per 1000 records | memory of this process, round 1 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let raws: Vec<(RawLink, Summary)> = raw_links
        .iter()
        .zip(raw_runs)
        .filter_map(|(link, runs)| Some((*link, Summary::of(runs)?)))
        .collect();
    // Two baselines, each the strongest raw loop by its own measure: the best median rate for the rate ratio,
    // the lowest client CPU per record for the CPU ratio (usually the `pipelined` loop for the CPU, either for
    // the rate: Redis is the limit).
    let by_rate = raws.iter().max_by(|a, b| a.1.rate.total_cmp(&b.1.rate)).map(|(_, s)| s);
    let by_cpu = raws
        .iter()
        .min_by(|a, b| a.1.client_us.total_cmp(&b.1.client_us))
        .map(|(_, s)| s);
    let ratios = |s: &Summary| match (by_rate, by_cpu) {
        (Some(rate), Some(cpu)) => (
            format!("{:.3}", s.rate / rate.rate),
            format!("{:.2}", s.client_us / cpu.client_us),
        ),
        _ => ("n/a".to_owned(), "n/a".to_owned()),
    };
    for (link, summary) in &raws {
        let (ratio, cpu) = ratios(summary);
        let marks: Vec<&str> = [
            by_rate
                .is_some_and(|r| std::ptr::eq(r, summary))
                .then_some("rate baseline"),
            by_cpu
                .is_some_and(|r| std::ptr::eq(r, summary))
                .then_some("CPU baseline"),
        ]
        .into_iter()
        .flatten()
        .collect();
        println!(
            "| raw XREADGROUP + pipelined XACK (8 shard tasks, {}){} | {:.0} | {:.0} - {:.0} | {ratio} | {:.2} us | {cpu} | {} |",
            if args.cluster { "cluster connections" } else { link.label() },
            if marks.is_empty() { String::new() } else { format!(" ({})", marks.join(", ")) },
            summary.rate,
            summary.min,
            summary.max,
            summary.client_us,
            summary.rest()
        );
    }
    for (&members, runs) in args.members.iter().zip(sdk_runs).filter(|_| !args.no_sdk) {
        let Some(sdk) = Summary::of(runs) else { continue };
        let (ratio, cpu) = ratios(&sdk);
        println!(
            "| SDK, {members} member{} (no-op handler, XACK on) | {:.0} | {:.0} - {:.0} | {ratio} | {:.2} us | {cpu} | {} |",
            if members == 1 { "" } else { "s" },
            sdk.rate,
            sdk.min,
            sdk.max,
            sdk.client_us,
            sdk.rest()
        );
    }
}
