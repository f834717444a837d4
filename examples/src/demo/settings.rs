//! The demo's command line and its settings, defaults applied.

use anyhow::{bail, Result};
use clap::Parser;
use protocol::metadata::GroupTimings;
use std::io::IsTerminal;
use std::time::Duration;

/// Shards of the demo stream.
pub(crate) const SHARDS: u32 = 8;
/// Consumers at the start.
pub(crate) const CONSUMERS: usize = 3;
/// Producers.
pub(crate) const PRODUCERS: usize = 2;
/// Most records per `send_batch`.
pub(crate) const MAX_BATCH: usize = 500;
/// Publishing ticks per second when rate-limited.
pub(crate) const TICKS_PER_SECOND: u64 = 100;

#[derive(Parser, Debug)]
#[command(about = "redis-stream-coord demo: 3 consumers, 2 producers, a crash and a join, then a summary")]
pub(crate) struct Args {
    /// Redis to use instead of starting a private redis-server; the demo leaves a `demo-*` stream in it. Only this
    /// flag selects it: an exported `REDIS_URL` is ignored (and said so), so that the demo never writes into a
    /// Redis by accident.
    #[arg(long, conflicts_with = "cluster")]
    pub(crate) redis_url: Option<String>,
    /// Run on a private local Redis Cluster of three masters (started and removed like the private
    /// redis-server; needs redis-server 7.0 or newer) instead of one server: the shards spread over the masters.
    #[arg(long)]
    pub(crate) cluster: bool,
    /// An external coordinator instead of the in-process one; it must use the Redis of --redis-url. Flag only, as
    /// --redis-url.
    #[arg(long, requires = "redis_url")]
    pub(crate) coordinator_url: Option<String>,
    /// Admin bearer token of the external coordinator (to create the group), if it requires one.
    #[arg(long, env = "COORD_ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: Option<String>,
    /// Client bearer token of the external coordinator, if it requires one (the deprecated `COORDINATOR_TOKEN`
    /// is read too).
    #[arg(long, env = "COORD_CLIENT_TOKEN", hide_env_values = true)]
    pub(crate) coordinator_token: Option<String>,
    /// Records to publish [default: 200000; 5000 with --short].
    #[arg(long)]
    pub(crate) records: Option<u64>,
    /// Publishing rate of both producers together, records/s; 0: as fast as possible [default: 20000; 1000 with
    /// --short].
    #[arg(long)]
    pub(crate) rate: Option<u64>,
    /// Distinct keys.
    #[arg(long, default_value_t = 1000)]
    pub(crate) keys: u64,
    /// Stream name [default: demo-<unique>].
    #[arg(long)]
    pub(crate) stream: Option<String>,
    /// Consumer group name.
    #[arg(long, default_value = "demo")]
    pub(crate) group: String,
    /// A small, fast run (CI): 5000 records at 1000/s, member TTL 2 s.
    #[arg(long)]
    pub(crate) short: bool,
    /// Plain log lines instead of progress bars (automatic when stdout is not a terminal).
    #[arg(long)]
    pub(crate) no_progress: bool,
    /// How long to wait after publishing for every record to be processed, in seconds [default: 60; 20 with
    /// --short].
    #[arg(long)]
    pub(crate) deadline_secs: Option<u64>,
}

/// The run's settings, defaults applied.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) records: u64,
    pub(crate) rate: u64,
    pub(crate) keys: u64,
    pub(crate) stream: String,
    pub(crate) group: String,
    pub(crate) timings: GroupTimings,
    pub(crate) deadline: Duration,
    pub(crate) progress: bool,
    pub(crate) coordinator_token: Option<String>,
}

impl Settings {
    pub(crate) fn new(args: &Args) -> Result<Settings> {
        let timings = if args.short {
            GroupTimings {
                member_ttl_ms: 2_000,
                heartbeat_interval_ms: 200,
                rebalance_timeout_ms: 2_000,
                assignment_lease_ms: 1_600,
            }
        } else {
            GroupTimings {
                member_ttl_ms: 3_000,
                heartbeat_interval_ms: 300,
                rebalance_timeout_ms: 3_000,
                assignment_lease_ms: 2_400,
            }
        };
        let records = args.records.unwrap_or(if args.short { 5_000 } else { 200_000 });
        if records < 2 {
            bail!("--records must be at least 2");
        }
        if args.keys < PRODUCERS as u64 {
            bail!("--keys must be at least {PRODUCERS}");
        }
        let stream = args.stream.clone().unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            format!("demo-{:x}{:08x}", std::process::id(), nanos)
        });
        Ok(Settings {
            records,
            rate: args.rate.unwrap_or(if args.short { 1_000 } else { 20_000 }),
            keys: args.keys,
            stream,
            group: args.group.clone(),
            timings,
            deadline: Duration::from_secs(args.deadline_secs.unwrap_or(if args.short { 20 } else { 60 })),
            progress: !args.no_progress && std::io::stdout().is_terminal(),
            coordinator_token: args.coordinator_token.clone().filter(|t| !t.is_empty()),
        })
    }

    pub(crate) fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    pub(crate) fn member_ttl(&self) -> Duration {
        Self::ms(self.timings.member_ttl_ms)
    }
}
