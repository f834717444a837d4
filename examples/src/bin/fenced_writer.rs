//! A worker whose side effects are fenced: each entry (fields `account`, `amount`) is written to the Redis hash
//! `fenced-writer:<account>` through a script that refuses a write carrying a lower fencing token than the hash
//! has already accepted for the shard (`examples/src/fenced_hset.lua`, pattern in `docs/fencing.md`). A worker
//! paused past its lease (GC, frozen VM, SIGSTOP) that resumes and finishes a write after its shard moved is
//! refused instead of overwriting what the shard's new owner wrote.
//!
//! ```text
//! cargo run -p examples --bin fenced_writer -- \
//!     --stream orders --group ledger --member-id writer-1 \
//!     --redis-url redis://127.0.0.1:6379 --coordinator-url http://127.0.0.1:7400
//! ```
//!
//! Ctrl-C closes it gracefully. `RUST_LOG` sets the log filter (default `info`).

use anyhow::{Context, Result};
use clap::Parser;
use examples::fenced_write::{apply_entry, FencedHash, WriteOutcome};
use examples::member_args::MemberArgs;
use stream_consumer::{CancellationToken, Consumer, FencingToken, Message, RebalanceListener, ShardId};
use tracing::{info, warn};

#[derive(Parser, Debug)]
#[command(about = "A redis-stream-coord worker with fenced writes to Redis hashes")]
struct Args {
    #[command(flatten)]
    member: MemberArgs,
    /// Coordinator base URL; repeat the flag (or comma-separate the variable) for several.
    #[arg(
        long = "coordinator-url",
        env = "COORDINATOR_URL",
        value_delimiter = ',',
        required = true
    )]
    coordinator_urls: Vec<String>,
    #[command(flatten)]
    coordinator_tls: examples::coordinator_tls::CoordinatorTlsArgs,
}

/// Logs the token each assignment starts with.
struct LogTokens;

impl RebalanceListener for LogTokens {
    async fn on_assigned(&self, shard: ShardId, token: FencingToken) {
        info!(%shard, %token, "shard assigned");
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let client = redis::Client::open(args.member.redis_url.as_str()).context("invalid Redis URL")?;
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .context("cannot connect to Redis")?;
    let hash = FencedHash::new();
    let mut builder = Consumer::builder(&args.member.stream, &args.member.group)
        .coordinators(args.coordinator_urls.iter().cloned())
        .coordinator_tls(args.coordinator_tls.options())
        .redis(&args.member.redis_url)
        .rebalance_listener(LogTokens);
    if let Some(id) = &args.member.member_id {
        builder = builder.member_id(id);
    }
    // The member id is only known once the builder picked one; the handler needs it for the `writer` field.
    let writer = args
        .member
        .member_id
        .clone()
        .unwrap_or_else(|| "fenced-writer".to_owned());
    let consumer = builder
        .handler(move |msg: Message| {
            let (hash, mut conn, writer) = (hash.clone(), conn.clone(), writer.clone());
            async move {
                match apply_entry(&hash, &mut conn, &msg, &writer).await? {
                    WriteOutcome::Applied => {}
                    // The shard has a newer owner, which claims this entry and writes it itself. An error would
                    // only retry a write that can never succeed.
                    WriteOutcome::Refused { stored } => warn!(shard = %msg.shard(), id = %msg.id(),
                        token = %msg.fencing_token(), %stored, "write refused: the shard has a newer owner"),
                }
                Ok::<_, redis::RedisError>(())
            }
        })
        .build()
        .context("invalid configuration")?;
    info!(stream = %args.member.stream, group = %args.member.group, member_id = %consumer.member_id(), "fenced writer starting");
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    let report = consumer.run(shutdown).await.context("consumer failed")?;
    info!(left = report.left, "fenced writer stopped");
    Ok(())
}
