//! Latency benchmark (issue 7, items 5 and 6): rebalance latency (join, graceful leave, kill) and end-to-end
//! publish-to-handler latency, against one private `redis-server` (started through `test_support::RedisServer`)
//! and an in-process coordinator.
//!
//! ```text
//! cargo run --release -p benches --bin latency_bench -- --trials 5 --rate 2000 --e2e-secs 10
//! ```
//!
//! Timings: the defaults (member TTL 10 s, heartbeat 2 s, lease 8 s) scaled down: member TTL 3 s, heartbeat
//! 300 ms, assignment lease 2.4 s, rebalance timeout 3 s; consumers: lease safety margin 150 ms, request
//! timeout 1 s, read block 1 s; the coordinator's tick interval is its default (250 ms) unless `--tick-ms`.
//!
//! # Rebalance (item 5)
//! A background task appends `--produce-rate` entries/s round-robin over the 8 shards (raw `XADD`), so a shard
//! that changes hands has entries waiting; every handler takes `--handler-ms` (the work a drain waits for).
//! Member `a` runs throughout. Every trial then measures, each from a settled group and after a random pause
//! of up to one heartbeat interval (so events fall at a random phase of the heartbeats):
//! * join: `b<i>` is spawned; time to its first handled entry (first read of a newly assigned shard, while `a`
//!   drains it) and to the first handled entry of the last of its shards (the rebalance done).
//! * leave: `b<i>` closes gracefully (`ConsumerHandle::close`: drain, revoke, leave); time until `a` handled an
//!   entry of every shard `b<i>` read (goal <= 1 heartbeat interval + drain).
//! * kill: `c<i>` joins (a second join sample), then is aborted (`ConsumerHandle::abort`: no drain, no leave,
//!   like kill -9); time until `a` handled an entry of every shard `c<i>` read (goal <= member TTL + 1 interval).
//!
//! # End-to-end (item 6)
//! On a second stream, `--e2e-members` consumers (no-op handler) and a producer SDK `send()` per record at
//! `--rate` records/s for `--e2e-secs` seconds; each record carries its send time (field `t`, ns since a
//! process-wide origin, taken just before `send()`), the handler records `now - t`. Prints p50/p90/p99/max.
// The coordinator's create path nests deep async state machines; the default limit (128) is too low.
#![recursion_limit = "256"]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use benches::settle::settled;
use clap::Parser;
use coord_server::server::CoordinatorHandle;
use protocol::keys;
use protocol::metadata::GroupTimings;
use protocol::names::StreamName;
use stream_consumer::{CancellationToken, Consumer, ConsumerBuilder, ConsumerHandle, Message, ShardId};
use stream_producer::Producer;
use test_support::RedisServer;

/// Shards of both streams.
const SHARDS: u32 = 8;

#[derive(Parser, Debug)]
#[command(about = "Rebalance latency (join, leave, kill) and publish-to-handler latency")]
struct Args {
    /// Trials of the rebalance cases (each: join, leave, join, kill).
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// Rebalance: background entries per second over the 8 shards.
    #[arg(long, default_value_t = 800)]
    produce_rate: u64,
    /// Rebalance: work per entry in the handler, in milliseconds.
    #[arg(long, default_value_t = 2)]
    handler_ms: u64,
    /// End-to-end: records per second.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// End-to-end: seconds of publishing.
    #[arg(long, default_value_t = 10)]
    e2e_secs: u64,
    /// End-to-end: consumers.
    #[arg(long, default_value_t = 2)]
    e2e_members: usize,
    /// Coordinator tick interval in milliseconds (its default: 250).
    #[arg(long, default_value_t = 250)]
    tick_ms: u64,
    /// Skip the rebalance cases.
    #[arg(long)]
    no_rebalance: bool,
    /// Skip the end-to-end case.
    #[arg(long)]
    no_e2e: bool,
}

fn timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: 3_000,
        heartbeat_interval_ms: 300,
        rebalance_timeout_ms: 3_000,
        assignment_lease_ms: 2_400,
    }
}

fn heartbeat_interval() -> Duration {
    Duration::from_millis(timings().heartbeat_interval_ms)
}

/// Process-wide origin of the send timestamps.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Sleeps a random time in `[0, max)`: events happen at a random phase of the members' heartbeats, as they
/// would in production, instead of right after the heartbeat answer that settled the group.
async fn random_phase(max: Duration) {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let max_us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
    tokio::time::sleep(Duration::from_micros(random % max_us)).await;
}

fn nanos_since_origin() -> u64 {
    u64::try_from(origin().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

struct Env {
    coordinator: CoordinatorHandle,
    redis_url: String,
}

impl Env {
    async fn create_group(&self, stream: &StreamName, group: &str) -> Result<()> {
        benches::group::create(&self.coordinator, stream, group, SHARDS, Some(timings())).await
    }

    fn builder(&self, stream: &StreamName, group: &str, member: &str) -> ConsumerBuilder {
        let t = timings();
        Consumer::builder(stream.as_str(), group)
            .coordinator(self.coordinator.url())
            .redis(self.redis_url.as_str())
            .member_id(member)
            .heartbeat_interval(Duration::from_millis(t.heartbeat_interval_ms))
            .member_ttl(Duration::from_millis(t.member_ttl_ms))
            .assignment_lease(Duration::from_millis(t.assignment_lease_ms))
            .lease_safety_margin(Duration::from_millis(150))
            .request_timeout(Duration::from_secs(1))
            .read_block(Duration::from_secs(1))
            .drain_timeout(Duration::from_secs(5))
    }
}

/// First handled entry per (member, shard) since the last `reset`.
#[derive(Clone, Default)]
struct FirstReads(Arc<Mutex<HashMap<(String, u32), Instant>>>);

impl FirstReads {
    fn record(&self, member: &str, shard: u32) {
        let now = Instant::now();
        let mut map = self.0.lock().expect("not poisoned");
        map.entry((member.to_owned(), shard)).or_insert(now);
    }

    fn reset(&self) {
        self.0.lock().expect("not poisoned").clear();
    }

    fn get(&self, member: &str, shard: u32) -> Option<Instant> {
        self.0
            .lock()
            .expect("not poisoned")
            .get(&(member.to_owned(), shard))
            .copied()
    }

    /// Waits until `member` handled an entry of every shard in `shards`; returns the first and the last of those
    /// first reads.
    async fn wait_all(&self, member: &str, shards: &[u32], deadline: Duration) -> Result<(Instant, Instant)> {
        let until = Instant::now() + deadline;
        loop {
            let times: Vec<Instant> = shards.iter().filter_map(|&s| self.get(member, s)).collect();
            if times.len() == shards.len() && !times.is_empty() {
                let first = *times.iter().min().expect("not empty");
                let last = *times.iter().max().expect("not empty");
                return Ok((first, last));
            }
            if Instant::now() > until {
                bail!("{member} did not read all of {shards:?} within {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn rebalance_member(
    env: &Env,
    stream: &StreamName,
    member: &str,
    reads: &FirstReads,
    work: Duration,
) -> Result<ConsumerHandle> {
    let (reads, who) = (reads.clone(), member.to_owned());
    let consumer = env
        .builder(stream, "lat", member)
        .handler(move |msg: Message| {
            reads.record(&who, msg.shard().0);
            async move {
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                Ok::<_, std::convert::Infallible>(())
            }
        })
        .build()?;
    Ok(consumer.spawn())
}

fn shards_of(h: &ConsumerHandle) -> Vec<u32> {
    h.status().reading.iter().map(|s| s.0).collect()
}

/// Appends entries round-robin over the shards at `rate` per second until `stop`.
fn spawn_background_producer(
    client: redis::Client,
    stream: StreamName,
    rate: u64,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Result<u64>> {
    tokio::spawn(async move {
        let keys: Vec<String> = (0..SHARDS).map(|s| keys::shard_stream(&stream, ShardId(s))).collect();
        let mut con = client.get_multiplexed_async_connection().await?;
        let start = Instant::now();
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.is_cancelled() {
            tick.tick().await;
            let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
            if due <= sent {
                continue;
            }
            let mut pipe = redis::pipe();
            for n in sent..due {
                pipe.cmd("XADD")
                    .arg(&keys[(n % u64::from(SHARDS)) as usize])
                    .arg("*")
                    .arg("n")
                    .arg(n)
                    .ignore();
            }
            let () = pipe.query_async(&mut con).await?;
            sent = due;
        }
        Ok(sent)
    })
}

#[derive(Default)]
struct Samples {
    join_first: Vec<Duration>,
    join_all: Vec<Duration>,
    leave_first: Vec<Duration>,
    leave_all: Vec<Duration>,
    kill_first: Vec<Duration>,
    kill_all: Vec<Duration>,
}

/// Joins `member` to a group where `a` reads everything; returns the handle once settled.
async fn join_trial(
    env: &Env,
    stream: &StreamName,
    a: &ConsumerHandle,
    member: &str,
    reads: &FirstReads,
    work: Duration,
    samples: &mut Samples,
) -> Result<ConsumerHandle> {
    random_phase(heartbeat_interval()).await;
    reads.reset();
    let t0 = Instant::now();
    let b = rebalance_member(env, stream, member, reads, work)?;
    settled(&[a, &b], SHARDS, Duration::from_secs(20)).await?;
    let mine = shards_of(&b);
    let (first, last) = reads.wait_all(member, &mine, Duration::from_secs(10)).await?;
    samples.join_first.push(first - t0);
    samples.join_all.push(last - t0);
    Ok(b)
}

async fn rebalance(env: &Env, args: &Args, client: &redis::Client) -> Result<Samples> {
    let stream = StreamName::new("lat-rebalance")?;
    env.create_group(&stream, "lat").await?;
    let stop = CancellationToken::new();
    let producer = spawn_background_producer(client.clone(), stream.clone(), args.produce_rate, stop.clone());
    let reads = FirstReads::default();
    let work = Duration::from_millis(args.handler_ms);
    let a = rebalance_member(env, &stream, "a", &reads, work)?;
    settled(&[&a], SHARDS, Duration::from_secs(20)).await?;
    let mut samples = Samples::default();
    for trial in 1..=args.trials {
        // Join, then graceful leave.
        let member = format!("b{trial}");
        let b = join_trial(env, &stream, &a, &member, &reads, work, &mut samples).await?;
        let moved = shards_of(&b);
        random_phase(heartbeat_interval()).await;
        reads.reset();
        let t0 = Instant::now();
        let close = tokio::spawn(b.close());
        let (first, last) = reads.wait_all("a", &moved, Duration::from_secs(20)).await?;
        let report = close.await??;
        ensure!(report.left, "{member} did not leave");
        samples.leave_first.push(first - t0);
        samples.leave_all.push(last - t0);
        settled(&[&a], SHARDS, Duration::from_secs(20)).await?;

        // Join (a second sample), then kill.
        let member = format!("c{trial}");
        let c = join_trial(env, &stream, &a, &member, &reads, work, &mut samples).await?;
        let moved = shards_of(&c);
        random_phase(heartbeat_interval()).await;
        reads.reset();
        let t0 = Instant::now();
        c.abort().await;
        let (first, last) = reads.wait_all("a", &moved, Duration::from_secs(30)).await?;
        samples.kill_first.push(first - t0);
        samples.kill_all.push(last - t0);
        settled(&[&a], SHARDS, Duration::from_secs(20)).await?;
        println!(
            "trial {trial}: join {:.0}/{:.0} ms, leave {:.0}/{:.0} ms, join {:.0}/{:.0} ms, kill {:.0}/{:.0} ms \
             (first shard / all shards)",
            ms(samples.join_first[2 * trial - 2]),
            ms(samples.join_all[2 * trial - 2]),
            ms(samples.leave_first[trial - 1]),
            ms(samples.leave_all[trial - 1]),
            ms(samples.join_first[2 * trial - 1]),
            ms(samples.join_all[2 * trial - 1]),
            ms(samples.kill_first[trial - 1]),
            ms(samples.kill_all[trial - 1]),
        );
    }
    a.close().await?;
    stop.cancel();
    producer.await??;
    Ok(samples)
}

struct E2e {
    sent: u64,
    received: u64,
    latencies: Vec<Duration>,
}

async fn end_to_end(env: &Env, args: &Args) -> Result<E2e> {
    let stream = StreamName::new("lat-e2e")?;
    env.create_group(&stream, "e2e").await?;
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let received = Arc::new(AtomicU64::new(0));
    let mut members = Vec::new();
    for m in 0..args.e2e_members {
        let (latencies, received) = (latencies.clone(), received.clone());
        let consumer = env
            .builder(&stream, "e2e", &format!("e{m}"))
            .handler(move |msg: Message| {
                let now = nanos_since_origin();
                if let Some(sent) = msg.get_str("t").and_then(|t| t.parse::<u64>().ok()) {
                    let lat = Duration::from_nanos(now.saturating_sub(sent));
                    latencies.lock().expect("not poisoned").push(lat);
                    received.fetch_add(1, Ordering::Relaxed);
                }
                std::future::ready(Ok::<_, std::convert::Infallible>(()))
            })
            .build()?;
        members.push(consumer.spawn());
    }
    let refs: Vec<&ConsumerHandle> = members.iter().collect();
    settled(&refs, SHARDS, Duration::from_secs(20)).await?;

    let producer = Arc::new(
        Producer::builder(stream.as_str())
            .coordinator(env.coordinator.url())
            .redis(env.redis_url.as_str())
            .build()?,
    );
    producer.ready().await?;
    let start = Instant::now();
    let duration = Duration::from_secs(args.e2e_secs);
    let mut sent = 0u64;
    let mut sends = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while start.elapsed() < duration {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * args.rate as f64) as u64;
        while sent < due {
            let producer = producer.clone();
            let key = format!("k{}", sent % 10_000);
            sends.spawn(async move {
                let t = nanos_since_origin().to_string();
                producer.send(key.as_bytes(), &[("t", t.as_bytes())]).await
            });
            sent += 1;
        }
        while let Some(done) = sends.try_join_next() {
            done??;
        }
    }
    while let Some(done) = sends.join_next().await {
        done??;
    }
    let until = Instant::now() + Duration::from_secs(10);
    while received.load(Ordering::Relaxed) < sent && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let producer = Arc::into_inner(producer).context("every send finished")?;
    producer.close().await?;
    for m in members {
        m.close().await?;
    }
    let mut latencies = std::mem::take(&mut *latencies.lock().expect("not poisoned"));
    latencies.sort();
    Ok(E2e {
        sent,
        received: received.load(Ordering::Relaxed),
        latencies,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// `median | max` (the median of an even count is the mean of the middle two).
fn median_max(v: &[Duration]) -> String {
    let mut s = v.to_vec();
    s.sort();
    let median = match s.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2,
    };
    format!(
        "{:.0} ms | {:.0} ms",
        ms(median),
        ms(s.last().copied().unwrap_or_default())
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let _ = origin();
    let redis = RedisServer::builder()
        .try_start()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let client = redis::Client::open(redis.url())?;
    let mut config = coord_server::Config::new(redis.url());
    config.listen = "127.0.0.1:0".parse()?;
    config.tick_interval = Duration::from_millis(args.tick_ms);
    // Short enough for the benchmark's 2.4 s lease (`Config::check_timings`).
    config.mutex_ttl = Duration::from_millis(1_200);
    config.critical_section_timeout = Duration::from_millis(1_000);
    let coordinator = CoordinatorHandle::spawn(config).await.context("coordinator")?;
    let env = Env {
        coordinator,
        redis_url: redis.url(),
    };
    let t = timings();
    println!(
        "timings: member TTL {} ms, heartbeat {} ms, lease {} ms, rebalance timeout {} ms, coordinator tick {} ms; \
         consumer lease margin 150 ms, read block 1 s",
        t.member_ttl_ms, t.heartbeat_interval_ms, t.assignment_lease_ms, t.rebalance_timeout_ms, args.tick_ms
    );

    let rebalance_samples = if args.no_rebalance {
        None
    } else {
        println!(
            "rebalance: {} trials, {} entries/s in the background, handler {} ms per entry",
            args.trials, args.produce_rate, args.handler_ms
        );
        Some(rebalance(&env, &args, &client).await?)
    };
    let e2e = if args.no_e2e {
        None
    } else {
        Some(end_to_end(&env, &args).await?)
    };

    if let Some(s) = &rebalance_samples {
        print_rebalance(&args, s);
    }
    if let Some(e) = &e2e {
        print_end_to_end(&args, e);
    }
    env.coordinator.shutdown().await;
    drop(redis);
    Ok(())
}

/// The rebalance table: join, graceful leave and kill, against their goals.
fn print_rebalance(args: &Args, s: &Samples) {
    let t = timings();
    let interval = Duration::from_millis(t.heartbeat_interval_ms);
    let ttl = Duration::from_millis(t.member_ttl_ms);
    let work = Duration::from_millis(args.handler_ms);
    println!();
    println!(
        "## Rebalance latency (member TTL {} ms, heartbeat {} ms, lease {} ms, tick {} ms; {} trials)",
        t.member_ttl_ms, t.heartbeat_interval_ms, t.assignment_lease_ms, args.tick_ms, args.trials
    );
    println!("| event -> shards read by their new owner | first shard median | max | all shards median | max | goal |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| join -> first read of a newly assigned shard ({} joins) | {} | {} | |",
        s.join_first.len(),
        median_max(&s.join_first),
        median_max(&s.join_all)
    );
    println!(
        "| graceful leave (close) -> read elsewhere | {} | {} | <= {:.0} ms (1 interval + drain {} ms) |",
        median_max(&s.leave_first),
        median_max(&s.leave_all),
        ms(interval + work),
        args.handler_ms
    );
    println!(
        "| kill (abort, no leave) -> read elsewhere | {} | {} | <= {:.0} ms (TTL + 1 interval) |",
        median_max(&s.kill_first),
        median_max(&s.kill_all),
        ms(ttl + interval)
    );
}

/// The end-to-end latency table.
fn print_end_to_end(args: &Args, e: &E2e) {
    let l = &e.latencies;
    println!();
    println!(
        "## End-to-end latency (producer send() -> handler; {} records/s for {} s, {} consumers, {SHARDS} shards)",
        args.rate, args.e2e_secs, args.e2e_members
    );
    println!("| sent | handled | p50 | p90 | p99 | max |");
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
        e.sent,
        e.received,
        ms(percentile(l, 0.5)),
        ms(percentile(l, 0.9)),
        ms(percentile(l, 0.99)),
        ms(l.last().copied().unwrap_or_default())
    );
}
