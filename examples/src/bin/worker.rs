//! A consumer-group worker: joins a group through the coordinator, reads the shards it is assigned, logs every
//! assignment change and, every few seconds, the messages processed per second and the lag of its shards, and leaves gracefully on SIGTERM or SIGINT (in-flight work finished, shards reported
//! revoked, group left, so its shards move at once).
//!
//! ```text
//! cargo run -p examples --bin worker -- \
//!     --stream orders --group billing --member-id worker-1 \
//!     --redis-url redis://127.0.0.1:6379 \
//!     --coordinator-url http://127.0.0.1:7400 --coordinator-url http://127.0.0.1:7401
//! ```
//!
//! Every flag can also come from the environment (`STREAM`, `GROUP`, `MEMBER_ID`, `REDIS_URL`,
//! `COORD_URL` as a comma-separated list, `COORD_CLIENT_TOKEN`, ...; see docs/configuration.md). The old names
//! `COORDINATOR_URL` and `COORDINATOR_TOKEN` still work, with a deprecation warning. `RUST_LOG` sets the log filter (default `info`).

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use examples::member_args::MemberArgs;
use redis::streams::StreamInfoGroupsReply;
use redis::AsyncCommands;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stream_consumer::{
    CancellationToken, Consumer, FencingToken, FileVersionStore, Message, RebalanceListener, ShardId, StartPosition,
};
use tracing::{debug, info, warn};

#[derive(Parser, Debug, Clone)]
#[command(about = "A redis-stream-coord consumer-group worker")]
struct Args {
    #[command(flatten)]
    member: MemberArgs,
    /// Coordinator base URL; repeat the flag (or comma-separate the variable) for several. Required (flag,
    /// `COORD_URL`, or the deprecated `COORDINATOR_URL`).
    #[arg(long = "coordinator-url", env = "COORD_URL", value_delimiter = ',')]
    coordinator_urls: Vec<String>,
    /// Bearer token of the coordinator's client endpoints, if it requires one (also the deprecated
    /// `COORDINATOR_TOKEN`).
    #[arg(long, env = "COORD_CLIENT_TOKEN", hide_env_values = true)]
    coordinator_token: Option<String>,
    #[command(flatten)]
    coordinator_tls: examples::coordinator_tls::CoordinatorTlsArgs,
    /// Seconds between two progress lines (processed/s, lag, pending).
    #[arg(long, env = "REPORT_EVERY_SECS", default_value_t = 5)]
    report_every_secs: u64,
    /// Where a brand-new Redis consumer group starts on each shard.
    #[arg(long, env = "START_FROM", value_enum, default_value_t = Start::Beginning)]
    start_from: Start,
    /// Keep the highest observed metadata version in this directory (survives restarts); in memory otherwise.
    #[arg(long, env = "VERSION_DIR")]
    version_dir: Option<PathBuf>,
    /// Deliveries after which an entry is dead-lettered.
    #[arg(long, env = "MAX_DELIVERIES", default_value_t = stream_consumer::DEFAULT_MAX_DELIVERIES)]
    max_deliveries: u32,
    /// How long a graceful shutdown waits for in-flight messages, in seconds.
    #[arg(long, env = "DRAIN_TIMEOUT_SECS", default_value_t = 30)]
    drain_timeout_secs: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Start {
    Beginning,
    End,
}

/// Logs every rebalance callback.
struct LogRebalance {
    handled: Arc<Mutex<BTreeMap<ShardId, u64>>>,
}

impl RebalanceListener for LogRebalance {
    async fn on_assigned(&self, shard: ShardId, token: FencingToken) {
        info!(%shard, %token, "shard assigned");
    }

    async fn on_revoked(&self, shard: ShardId) {
        let handled = self.handled.lock().expect("counter lock").remove(&shard).unwrap_or(0);
        info!(%shard, handled, "shard revoked");
    }

    async fn on_lost(&self, shards: Vec<ShardId>) {
        warn!(
            shards = %shard_list(&shards),
            "shards lost (fenced, forgotten, or the assignment lease ran out)"
        );
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        // Colour codes only where a person reads them, not in a redirected log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let mut args = Args::parse();
    examples::deprecated_env_alias(&mut args.coordinator_urls, "COORDINATOR_URL", "COORD_URL");
    if args.coordinator_urls.is_empty() {
        anyhow::bail!("no coordinator: pass --coordinator-url URL or set COORD_URL");
    }
    if args.coordinator_token.is_none() {
        let mut token = Vec::new();
        examples::deprecated_env_alias(&mut token, "COORDINATOR_TOKEN", "COORD_CLIENT_TOKEN");
        args.coordinator_token = token.into_iter().next();
    }

    let handled: Arc<Mutex<BTreeMap<ShardId, u64>>> = Arc::default();
    let counts = Arc::clone(&handled);
    let processed = Arc::new(AtomicU64::new(0));
    let processed_in_handler = Arc::clone(&processed);
    let mut builder = Consumer::builder(&args.member.stream, &args.member.group)
        .coordinators(args.coordinator_urls.iter().cloned())
        .coordinator_tls(args.coordinator_tls.options())
        .redis(&args.member.redis_url)
        .start_from(match args.start_from {
            Start::Beginning => StartPosition::Beginning,
            Start::End => StartPosition::End,
        })
        .max_deliveries(args.max_deliveries)
        .drain_timeout(Duration::from_secs(args.drain_timeout_secs))
        .rebalance_listener(LogRebalance { handled })
        .handler(move |msg: Message| {
            let counts = Arc::clone(&counts);
            processed_in_handler.fetch_add(1, Ordering::Relaxed);
            async move {
                debug!(shard = %msg.shard(), id = %msg.id(), deliveries = msg.delivery_count(),
                    fields = msg.fields().count(), "message");
                *counts.lock().expect("counter lock").entry(msg.shard()).or_default() += 1;
                Ok::<_, std::convert::Infallible>(())
            }
        });
    if let Some(id) = &args.member.member_id {
        builder = builder.member_id(id);
    }
    if let Some(token) = &args.coordinator_token {
        builder = builder.coordinator_token(token);
    }
    if let Some(dir) = &args.version_dir {
        let store = FileVersionStore::new(dir).with_context(|| format!("version directory {}", dir.display()))?;
        builder = builder.version_store(store);
    }
    let consumer = builder.build().context("invalid configuration")?;
    let coordinators: Vec<String> = args
        .coordinator_urls
        .iter()
        .map(|u| protocol::redact::redact_url(u))
        .collect();
    info!(stream = %args.member.stream, group = %args.member.group, member_id = %consumer.member_id(),
        redis = %protocol::redact::redact_url(&args.member.redis_url), ?coordinators, "worker starting");

    tokio::spawn(log_assignments(consumer.status()));

    tokio::spawn(report_progress(args.clone(), consumer.status(), processed));

    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone()));
    let report = consumer.run(shutdown).await.context("consumer failed")?;
    info!(left = report.left, cut_short = ?report.killed_shards, "worker stopped");
    Ok(())
}

/// Logs every change of the reading set, whatever caused it.
async fn log_assignments(mut status: tokio::sync::watch::Receiver<stream_consumer::ConsumerStatus>) {
    let mut last = Vec::new();
    while status.changed().await.is_ok() {
        let s = status.borrow_and_update().clone();
        if s.reading != last {
            info!(reading = %shard_list(&s.reading), revoking = %shard_list(&s.revoking),
                waiting_for_previous_owner = %shard_list(&s.pending),
                metadata_version = %s.metadata_version, epoch = %s.member_epoch, "assignment");
            last = s.reading;
        }
    }
}

/// `0,3,4` (`-` for none): shard numbers as people read them, not `[ShardId(0), ...]`.
fn shard_list(shards: &[ShardId]) -> String {
    if shards.is_empty() {
        return "-".to_owned();
    }
    shards.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// Every `--report-every-secs`: messages processed per second since the last line, and the lag (entries not yet
/// delivered to the group) and pending entries (delivered, not acknowledged) of the shards this worker reads, from
/// `XINFO GROUPS`. Lag needs Redis 7; with 6.2 it shows `?`.
async fn report_progress(
    args: Args,
    status: tokio::sync::watch::Receiver<stream_consumer::ConsumerStatus>,
    processed: Arc<AtomicU64>,
) {
    let Ok(stream) = protocol::names::StreamName::new(&args.member.stream) else {
        return;
    };
    let redis = match redis::Client::open(args.member.redis_url.as_str()) {
        Ok(client) => client,
        Err(e) => {
            warn!(error = %e, "no progress lines: the Redis URL is not usable");
            return;
        }
    };
    let mut conn = None;
    let every = Duration::from_secs(args.report_every_secs.max(1));
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    let (mut last_count, mut last_at) = (0u64, Instant::now());
    loop {
        tick.tick().await;
        let count = processed.load(Ordering::Relaxed);
        let rate = (count - last_count) as f64 / last_at.elapsed().as_secs_f64();
        (last_count, last_at) = (count, Instant::now());
        let reading = status.borrow().reading.clone();
        if conn.is_none() {
            conn = redis.get_multiplexed_async_connection().await.ok();
        }
        let (mut lag, mut pending, mut lag_known) = (0usize, 0usize, true);
        if let Some(c) = conn.as_mut() {
            for &shard in &reading {
                let key = protocol::keys::shard_stream(&stream, shard);
                let Ok(reply) = c.xinfo_groups::<_, StreamInfoGroupsReply>(&key).await else {
                    lag_known = false;
                    continue;
                };
                if let Some(g) = reply.groups.iter().find(|g| g.name == args.member.group) {
                    pending += g.pending;
                    match g.lag {
                        Some(l) => lag += l,
                        None => lag_known = false,
                    }
                }
            }
        } else {
            lag_known = false;
        }
        let lag = if lag_known { lag.to_string() } else { "?".to_owned() };
        info!(
            "{rate:>8.0} processed/s | processed {count} | lag {lag} pending {pending} on shards {}",
            shard_list(&reading)
        );
    }
}

/// Cancels `shutdown` on SIGTERM (what Kubernetes sends) or SIGINT (Ctrl-C).
async fn signal_shutdown(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM: closing gracefully"),
                    _ = tokio::signal::ctrl_c() => info!("SIGINT: closing gracefully"),
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the worker gracefully");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        info!("Ctrl-C: closing gracefully");
    }
    shutdown.cancel();
}
