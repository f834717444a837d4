//! A producer that publishes records at a target rate through the SDK's batching mode and prints the achieved
//! rate periodically. SIGINT or SIGTERM closes it gracefully (everything accepted is published first).
//!
//! `coordctl add-shards` while it runs drops nothing: the records a shard fence refused were never written, and the
//! producer re-routes and sends them again itself (`ProducerBuilder::reroute_fenced`, on by default). Its "not
//! written" count is of records that finally failed, not of those refusals.
//!
//! ```text
//! cargo run -p examples --bin producer -- --stream orders --rate 5000 --keys 10000 --payload-bytes 200 \
//!     --redis-url redis://127.0.0.1:6379 --coordinator-url http://127.0.0.1:7400
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use stream_producer::{Producer, PublishError, Record};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser, Debug, Clone)]
#[command(about = "Publish records to a sharded Redis Stream at a target rate")]
struct Args {
    /// The stream (its routing must exist: create a group for it first).
    #[arg(long, env = "STREAM", default_value = "orders")]
    stream: String,
    /// Target records per second (0: as fast as possible).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Size of the key space (keys are `key-0` .. `key-<keys-1>`, picked pseudo-randomly).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// Redis URL.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Coordinator base URL (repeat for several instances, or comma-separate `COORD_URL`; the deprecated
    /// `COORDINATOR_URL` is read too) [default: http://127.0.0.1:7400].
    #[arg(long = "coordinator-url", env = "COORD_URL", value_delimiter = ',')]
    coordinator_urls: Vec<String>,
    #[command(flatten)]
    coordinator_tls: examples::coordinator_tls::CoordinatorTlsArgs,
    /// Seconds between rate reports.
    #[arg(long, default_value_t = 5)]
    report_every: u64,
}

/// Publishing ticks per second when rate-limited.
const TICKS_PER_SECOND: u64 = 100;

/// Enqueues records at the target rate until `stop` turns true.
async fn publish(
    producer: Arc<Producer>,
    args: Args,
    accepted: Arc<AtomicU64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let payload = vec![b'x'; args.payload_bytes];
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut record = move || {
        // xorshift64: cheap, good enough to spread keys.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        Record::with_key(format!("key-{}", seed % args.keys.max(1))).field("payload", payload.as_slice())
    };
    let per_tick = args.rate as f64 / TICKS_PER_SECOND as f64;
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / TICKS_PER_SECOND));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut owed = 0f64;
    let mut refused_logged = false;
    while !*stop.borrow() {
        let mut due = 1u64;
        if args.rate > 0 {
            tokio::select! {
                _ = stop.changed() => break,
                _ = tick.tick() => {}
            }
            owed += per_tick;
            due = owed as u64;
            owed -= due as f64;
        }
        for _ in 0..due {
            match producer.enqueue(record()).await {
                // The outcome shows in the producer's counters.
                Ok(_delivery) => {
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
                Err(e @ PublishError::Closed) => return Err(e.into()),
                Err(e) => {
                    if !refused_logged {
                        eprintln!("publish refused: {e}");
                        refused_logged = true;
                    }
                }
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let mut args = Args::parse();
    examples::deprecated_env_alias(&mut args.coordinator_urls, "COORDINATOR_URL", "COORD_URL");
    if args.coordinator_urls.is_empty() {
        args.coordinator_urls.push("http://127.0.0.1:7400".to_owned());
    }
    let producer = Producer::builder(args.stream.as_str())
        .coordinators(args.coordinator_urls.iter().cloned())
        .coordinator_tls(args.coordinator_tls.options())
        .redis(args.redis_url.as_str())
        .build()?;
    let routing = producer.ready().await?;
    println!(
        "publishing to {} ({} shards, routing version {}) at {} records/s",
        args.stream,
        routing.shard_count,
        routing.version,
        if args.rate == 0 {
            "max".to_string()
        } else {
            args.rate.to_string()
        }
    );

    let producer = Arc::new(producer);
    let accepted = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let publisher = tokio::spawn(publish(producer.clone(), args.clone(), accepted.clone(), stop_rx));

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut report = tokio::time::interval(Duration::from_secs(args.report_every.max(1)));
    report.tick().await;
    let (mut last_written, mut last_report) = (0u64, Instant::now());
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            _ = report.tick() => {
                let stats = producer.stats();
                let elapsed = last_report.elapsed().as_secs_f64();
                println!(
                    "{:>10.0} records/s written | accepted {} written {} not written {} unknown {} | \
                     routing v{} shards {} refusals {}",
                    (stats.records_written - last_written) as f64 / elapsed,
                    accepted.load(Ordering::Relaxed),
                    stats.records_written,
                    stats.records_not_written,
                    stats.records_unknown,
                    stats.routing_version.map(|v| v.0).unwrap_or(0),
                    stats.shard_count.unwrap_or(0),
                    stats.routing_refusals,
                );
                last_written = stats.records_written;
                last_report = Instant::now();
            }
        }
    }
    let _ = stop_tx.send(true);
    publisher.await??;
    let producer = Arc::into_inner(producer).context("the publishing task has ended")?;
    let accepted = accepted.load(Ordering::Relaxed);
    println!("closing: publishing what is queued");
    let stats = producer.close().await?;
    println!(
        "closed: accepted {accepted}, written {}, not written {}, unknown {}",
        stats.records_written, stats.records_not_written, stats.records_unknown
    );
    Ok(())
}
