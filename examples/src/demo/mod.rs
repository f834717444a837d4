//! The demo: a whole consumer group on one machine, with a crash and a join in the middle.
//!
//! ```text
//! cargo run --release -p examples --bin demo
//! ```
//!
//! 1. Redis: `--redis-url` / `REDIS_URL` when given, else a private `redis-server` from `PATH` on a free loopback
//!    port (persistence off, killed at the end; see `test_support::RedisServer`); with `--cluster`, a private
//!    local Redis Cluster of three masters (`test_support::cluster::RedisCluster`), the 8 shards spread over them (the
//!    demo prints which master serves which shard, and a quarter of the way through moves one shard's slot live
//!    to another master, printing the move).
//! 2. Coordinator: in-process (`CoordinatorHandle` on `127.0.0.1:0`), or an external one with
//!    `--coordinator-url` (then `--redis-url` must name the Redis that coordinator uses).
//! 3. The demo creates stream `demo-<unique>` with 8 shards and group `demo` through the admin API
//!    (`POST /v1/streams/{stream}/groups/{group}`), with short timings so a rebalance takes seconds: member TTL
//!    3 s, heartbeat 300 ms, assignment lease 2.4 s, rebalance timeout 3 s (`--short`: 2 s, 200 ms, 1.6 s, 2 s).
//! 4. Three consumers (`consumer-1..3`) and two producers run in this process. The producers publish `--records`
//!    keyed records (fields `key`, `seq`: a per-key sequence number; each key belongs to one producer) at
//!    `--rate` records/s, in batches (`send_batch`).
//! 5. When half the records are published, the consumer reading the most shards is aborted (a crash: no
//!    drain, no leave; its shards move when its member TTL runs out) and `consumer-4` joins.
//!    `ConsumerHandle::abort` still makes one brief attempt to acknowledge entries already handled, so
//!    "redelivered" is usually 0; entries a crashed member had read but not handled are claimed by the next
//!    owner (delivery count >= 2) and counted as "claimed".
//! 6. The demo waits (up to `--deadline-secs` after publishing ended) until every acknowledged record was
//!    processed, closes everything gracefully, and prints the summary. Every handling and every acknowledged
//!    publish is recorded into the history checker (`test_support::history`): its rules decide PASS (nothing
//!    acknowledged lost, per-key order except redeliveries, one member per shard at a time). The counts of the
//!    table (processed, redelivered, claimed): `examples::ledger`.
//!
//! With `--redis-url` the demo's stream (`demo-<unique>`: 8 shard streams and the group's metadata) stays in that
//! Redis afterwards.
//!
//! Exit status: 0 all checks passed; 1 a check failed (an acknowledged record was never processed, an order
//! violation, a rebalance not observed before the deadline); 2 setup failed (no `redis-server`, coordinator
//! unreachable, ...); 130 interrupted.

mod board;
mod output;
mod publish;
mod report;
mod run;
mod settings;

use clap::Parser;
use indicatif::{MultiProgress, ProgressDrawTarget};
use output::{LogWriter, Output};
use settings::{Args, Settings};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use test_support::cluster::RedisCluster;
use test_support::{LaunchError, RedisServer};

/// The private Redis the demo started, killed when dropped.
#[allow(dead_code)] // held for its drop
enum Launched {
    Single(RedisServer),
    Cluster(RedisCluster),
}

/// The demo: parses the command line, runs, prints the summary; the exit status as the module documentation
/// says.
pub async fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.coordinator_token.is_none() {
        let mut token = Vec::new();
        crate::deprecated_env_alias(&mut token, "COORDINATOR_TOKEN", "COORD_CLIENT_TOKEN");
        args.coordinator_token = token.into_iter().next();
    }
    if args.redis_url.is_none() && std::env::var_os("REDIS_URL").is_some() {
        eprintln!(
            "note: REDIS_URL is set but ignored; the demo starts a private redis-server (use --redis-url to pick one)"
        );
    }
    let settings = match Settings::new(&args) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("error: {}", crate::error_chain(&e));
            return ExitCode::from(2);
        }
    };
    let multi = MultiProgress::with_draw_target(if settings.progress {
        ProgressDrawTarget::stdout()
    } else {
        ProgressDrawTarget::hidden()
    });
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(LogWriter(multi.clone()))
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let out = Arc::new(Output::new(multi, settings.progress, settings.records));

    // Redis: given, or a private redis-server (killed when `launcher` is dropped, also on Ctrl-C).
    let (redis_url, redis_label, launcher) = match launch_redis(&args).await {
        Ok(launched) => launched,
        Err(e) => {
            out.finish();
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cluster = match &launcher {
        Some(Launched::Cluster(c)) => Some(c),
        _ => None,
    };
    let result = tokio::select! {
        r = run::run(&args, Arc::clone(&settings), redis_url, redis_label, cluster, Arc::clone(&out)) => r,
        _ = tokio::signal::ctrl_c() => {
            out.finish();
            eprintln!("interrupted");
            return ExitCode::from(130);
        }
    };
    match result {
        Ok(report) => {
            report.print();
            if report.failures().is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            out.finish();
            eprintln!("error: {}", crate::error_chain(&e));
            ExitCode::from(2)
        }
    }
}

/// The Redis of the run: `--redis-url`'s, or a private redis-server (a local cluster with `--cluster`). Answers
/// its URL (or `cluster:` target), the label of the summary, and what to drop at the end.
async fn launch_redis(args: &Args) -> Result<(String, String, Option<Launched>), LaunchError> {
    Ok(match args.redis_url.as_deref().filter(|u| !u.is_empty()) {
        // The label is printed and logged: never with the URL's password.
        Some(url) => {
            eprintln!(
                "USING YOUR REDIS {} (--redis-url): the demo writes a stream demo-* and a consumer group into it, and \
                 leaves them there",
                protocol::redact::redact_url(url)
            );
            (
                url.to_owned(),
                format!("{} (given)", protocol::redact::redact_url(url)),
                None,
            )
        }
        None if args.cluster => {
            let c = RedisCluster::builder().node_timeout_ms(5_000).try_start().await?;
            let label = format!(
                "{} (private 3-master Redis Cluster, {})",
                c.target(),
                c.nodes()[0].server().bin().display()
            );
            (c.target(), label, Some(Launched::Cluster(c)))
        }
        None => {
            let l = RedisServer::builder().try_start().await?;
            let label = format!("{} (private redis-server, {})", l.url(), l.bin().display());
            (l.url(), label, Some(Launched::Single(l)))
        }
    })
}
