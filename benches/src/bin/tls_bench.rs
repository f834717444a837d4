//! TLS cost: the producer's `send_batch` and the consumer's throughput over `rediss://` as a ratio of plaintext,
//! in the same run, against the same private `redis-server`, which serves both a plaintext port and a TLS port
//! (certificates generated at start, `test_support::tls::TestPki`).
//!
//! ```text
//! cargo run --release -p benches --bin tls_bench -- --records 200000 --rounds 3
//! ```
//!
//! * produce-plain / produce-tls: `--tasks` tasks calling `Producer::send_batch` with `--batch` records each
//!   (the default fenced path: a checked transaction per shard batch), `--connections` pipelined connections.
//! * consume-plain / consume-tls: one consumer (shared connection plus a dedicated blocking connection per shard)
//!   of a fresh group reading `--records` entries from the start with a no-op handler; timed from the first
//!   handled entry to the last.
//!
//! Modes run in interleaved rounds (round 1 of every mode, then round 2, ...); the summary gives each mode's
//! median rate, its spread, the client CPU per record (this process) and the Redis CPU per record (`INFO cpu`),
//! and the TLS / plaintext ratio of the medians. The coordinator (in process) talks to Redis in plaintext: it is
//! idle while a round runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use coord_server::server::CoordinatorHandle;
use protocol::names::StreamName;
use redis_link::TlsOptions;
use stream_consumer::{Consumer, Message, StartPosition};
use stream_producer::{Producer, Record};
use test_support::tls::TestPki;
use test_support::RedisServer;

#[derive(Parser, Debug)]
#[command(about = "Producer and consumer throughput over TLS as a ratio of plaintext")]
struct Args {
    /// Records per round and mode.
    #[arg(long, default_value_t = 100_000)]
    records: usize,
    /// Interleaved rounds of every mode.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Shards of the stream.
    #[arg(long, default_value_t = 8)]
    shards: u32,
    /// Tasks calling `send_batch`.
    #[arg(long, default_value_t = 8)]
    tasks: usize,
    /// Records per `send_batch` call.
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// The producer's pipelined connections.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
}

/// One timed round: how long, and the CPU it cost.
struct Round {
    took: Duration,
    client_cpu_s: f64,
    redis_cpu_s: f64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let pki = TestPki::generate();
    let plain_port = test_support::free_port();
    let redis = RedisServer::builder()
        .tls(pki.server_tls(false))
        .extra_arg("--port")
        .extra_arg(plain_port.to_string())
        .try_start()
        .await?;
    let tls_url = redis.url();
    let plain_url = format!("redis://127.0.0.1:{plain_port}");
    let tls = TlsOptions::new().ca_file(&pki.ca);
    let stream = StreamName::new("tls-bench")?;
    let coordinator = benches::group::coordinator(&plain_url, &stream, args.shards).await?;
    let modes = ["produce-plain", "produce-tls", "consume-plain", "consume-tls"];
    let mut results: Vec<Vec<Round>> = modes.iter().map(|_| Vec::new()).collect();
    let payload = vec![b'x'; args.payload_bytes];
    for round in 0..args.rounds {
        for (i, mode) in modes.iter().enumerate() {
            let over_tls = mode.ends_with("tls");
            let (url, tls) = if over_tls {
                (tls_url.as_str(), Some(tls.clone()))
            } else {
                (plain_url.as_str(), None)
            };
            let r = if mode.starts_with("produce") {
                produce(&args, &coordinator, &stream, url, tls, &payload, &redis).await?
            } else {
                let group = format!("g{round}-{mode}");
                consume(&args, &coordinator, &stream, &group, url, tls, &redis).await?
            };
            println!(
                "round {} {mode:<14} {:>10.0} records/s",
                round + 1,
                args.records as f64 / r.took.as_secs_f64()
            );
            results[i].push(r);
        }
    }
    summarize(&args, &modes, &results);
    Ok(())
}

async fn produce(
    args: &Args,
    coordinator: &CoordinatorHandle,
    stream: &StreamName,
    url: &str,
    tls: Option<TlsOptions>,
    payload: &[u8],
    redis: &RedisServer,
) -> Result<Round> {
    let mut builder = Producer::builder(stream.as_str())
        .coordinator(coordinator.url())
        .redis(url)
        .connections(args.connections);
    if let Some(tls) = tls {
        builder = builder.redis_tls(tls);
    }
    let producer = Arc::new(builder.build()?);
    producer.ready().await?;
    // Connections opened before the clock starts (the handshake is a one-off cost, not a per-record one).
    producer
        .send_batch(vec![Record::with_key("warm").field("p", payload)])
        .await?;
    let next = Arc::new(AtomicU64::new(0));
    let (cpu, redis_cpu) = (benches::cpu::process_cpu_seconds(), redis_cpu_seconds(redis).await?);
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.tasks)
        .map(|_| {
            let (producer, next, payload) = (producer.clone(), next.clone(), payload.to_vec());
            let (records, batch) = (args.records as u64, args.batch as u64);
            tokio::spawn(async move {
                loop {
                    let from = next.fetch_add(batch, Ordering::Relaxed);
                    if from >= records {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let batch: Vec<Record> = (from..(from + batch).min(records))
                        .map(|i| Record::with_key(format!("key-{i}")).field("p", payload.as_slice()))
                        .collect();
                    let n = batch.len();
                    let published = producer.send_batch(batch).await?;
                    ensure!(published.len() == n, "{} outcomes of {n}", published.len());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let took = start.elapsed();
    Ok(Round {
        took,
        client_cpu_s: benches::cpu::process_cpu_seconds() - cpu,
        redis_cpu_s: redis_cpu_seconds(redis).await? - redis_cpu,
    })
}

async fn consume(
    args: &Args,
    coordinator: &CoordinatorHandle,
    stream: &StreamName,
    group: &str,
    url: &str,
    tls: Option<TlsOptions>,
    redis: &RedisServer,
) -> Result<Round> {
    // The entries every consume round reads: the stream holds at least `records` from the produce rounds.
    benches::group::create(coordinator, stream, group, args.shards, None).await?;
    let handled = Arc::new(AtomicU64::new(0));
    let first = Arc::new(std::sync::OnceLock::<Instant>::new());
    let done = Arc::new(tokio::sync::Notify::new());
    let target = args.records as u64;
    let (h, f, d) = (handled.clone(), first.clone(), done.clone());
    let mut builder = Consumer::builder(stream.as_str(), group)
        .coordinator(coordinator.url())
        .redis(url)
        .start_from(StartPosition::Beginning)
        .batch_size(500)
        .handler(move |_m: Message| {
            let _ = f.get_or_init(Instant::now);
            if h.fetch_add(1, Ordering::Relaxed) + 1 == target {
                d.notify_one();
            }
            std::future::ready(Ok::<_, std::convert::Infallible>(()))
        });
    if let Some(tls) = tls {
        builder = builder.redis_tls(tls);
    }
    let (cpu, redis_cpu) = (benches::cpu::process_cpu_seconds(), redis_cpu_seconds(redis).await?);
    let handle = builder.build()?.spawn();
    tokio::time::timeout(Duration::from_secs(600), done.notified())
        .await
        .with_context(|| format!("{} of {target} handled", handled.load(Ordering::Relaxed)))?;
    let end = Instant::now();
    let round = Round {
        took: end - *first.get().context("nothing handled")?,
        client_cpu_s: benches::cpu::process_cpu_seconds() - cpu,
        redis_cpu_s: redis_cpu_seconds(redis).await? - redis_cpu,
    };
    handle.close().await?;
    Ok(round)
}

/// `used_cpu_sys + used_cpu_user` of the server.
async fn redis_cpu_seconds(redis: &RedisServer) -> Result<f64> {
    let info = redis.info("cpu").await;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_sys") + field("used_cpu_user"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn summarize(args: &Args, modes: &[&str], results: &[Vec<Round>]) {
    let n = args.records as f64;
    println!("\nmode             median rec/s   (min..max)          client us/rec  redis us/rec");
    let mut medians = Vec::new();
    for (mode, rounds) in modes.iter().zip(results) {
        let rates: Vec<f64> = rounds.iter().map(|r| n / r.took.as_secs_f64()).collect();
        let client = median(rounds.iter().map(|r| r.client_cpu_s * 1e6 / n).collect());
        let redis = median(rounds.iter().map(|r| r.redis_cpu_s * 1e6 / n).collect());
        let (min, max) = rates.iter().fold((f64::MAX, 0f64), |(a, b), &r| (a.min(r), b.max(r)));
        let m = median(rates);
        medians.push(m);
        println!("{mode:<16} {m:>12.0}   ({min:.0}..{max:.0})   {client:>12.2}  {redis:>12.2}");
    }
    println!(
        "\nTLS / plaintext: produce {:.2}, consume {:.2}",
        medians[1] / medians[0],
        medians[3] / medians[2]
    );
}
