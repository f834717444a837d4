//! `coordctl`: the admin command line of the redis-stream-coord coordinator.
//!
//! Human tables by default, `--json` for scripts (the coordinator's wire types). Exit status: 0 done, 1 the
//! coordinator refused or failed (its status and message on stderr), 2 usage error, 3 no usable answer (unreachable,
//! not the coordinator's JSON), 4 refused by `coordctl` itself (`recreate` without `--yes`).
//!
//! # Layout
//! * `client`: [`client::CliError`], what a command fails with (the admin API is
//!   [`client_core::admin::AdminClient`]).
//! * `output`: tables and durations.

mod client;
mod output;

use clap::{Parser, Subcommand};
use client::CliError;
use client_core::admin::{AdminClient, AdminError};
use protocol::messages::{CreateGroupRequest, RecreateGroupRequest};
use protocol::metadata::GroupTimings;
use protocol::StoreRevision;
use serde::Serialize;
use std::process::ExitCode;
use std::time::Duration;

/// Admin command line of the redis-stream-coord coordinator: groups, members, shards and routing.
///
/// Exit status: 0 done; 1 the coordinator refused or failed (status and message on stderr); 2 usage error;
/// 3 coordinator unreachable or not answering its JSON; 4 refused by coordctl (recreate without --yes).
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// Coordinator base URL (any instance, or the Service). `COORDINATOR_URL` is read too, as a deprecated alias
    /// (the first of a comma-separated list).
    /// [default: http://127.0.0.1:7400]
    #[arg(long, env = "COORD_URL", global = true)]
    url: Option<String>,
    /// Admin bearer token (required when the coordinator has one). Prefer the environment or --token-file: a
    /// flag's value is visible to every local user in /proc/PID/cmdline.
    #[arg(
        long,
        env = "COORD_ADMIN_TOKEN",
        hide_env_values = true,
        global = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// File holding the admin bearer token (surrounding whitespace ignored).
    #[arg(long, env = "COORD_ADMIN_TOKEN_FILE", global = true)]
    token_file: Option<std::path::PathBuf>,
    /// PEM file of the CA that signed the coordinator's certificate, for an `https://` URL (besides the system's
    /// roots).
    #[arg(long, env = "COORD_TLS_CA", global = true)]
    coordinator_tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate, for a coordinator that requires one (`--tls-client-ca`); with
    /// --coordinator-tls-key.
    #[arg(long, env = "COORD_TLS_CERT", global = true, requires = "coordinator_tls_key")]
    coordinator_tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --coordinator-tls-cert.
    #[arg(long, env = "COORD_TLS_KEY", global = true, requires = "coordinator_tls_cert")]
    coordinator_tls_key: Option<std::path::PathBuf>,
    /// Print JSON (the coordinator's wire types) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Per-request timeout, in ms.
    #[arg(long, default_value_t = 10_000, global = true)]
    timeout_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List groups from the coordinator's index.
    Groups {
        /// Rebuild the index first by scanning every metadata key (after the index was lost).
        #[arg(long)]
        rebuild: bool,
    },
    /// Describe a group: members, epochs, leases, target vs current owner per shard, drains, correction round, lag.
    Describe {
        /// Stream name.
        stream: String,
        /// Consumer group name.
        group: String,
    },
    /// Create a consumer group (and the stream's routing with --shards when the stream has none). A second call
    /// answers ALREADY_EXISTS.
    Create {
        /// Stream name.
        stream: String,
        /// Consumer group name.
        group: String,
        /// Shard count: required when the stream has no routing yet; otherwise absent or equal to the stream's.
        #[arg(long)]
        shards: Option<u32>,
        #[command(flatten)]
        timings: TimingFlags,
    },
    /// Grow a stream by COUNT shards. Groups adopt the new routing on their next tick.
    AddShards {
        /// Stream name.
        stream: String,
        /// How many shards to add.
        count: u32,
        /// Only if the routing is still at this revision (from `coordctl routing`). Without it a retried command
        /// adds the shards twice.
        #[arg(long, value_name = "REV")]
        if_match: Option<u64>,
    },
    /// Fence a member now. It is told to stop on its next heartbeat; its shards move when its lease ends.
    Fence {
        /// Stream name.
        stream: String,
        /// Consumer group name.
        group: String,
        /// Member id.
        member: String,
        /// Only if the group is still at this revision (from `coordctl describe`).
        #[arg(long, value_name = "REV")]
        if_match: Option<u64>,
    },
    /// Recreate a group whose metadata was lost. Prints the plan and does nothing without --yes.
    Recreate {
        /// Stream name.
        stream: String,
        /// Consumer group name.
        group: String,
        /// Shard count (must equal the stream's, see `coordctl routing`).
        #[arg(long)]
        shards: u32,
        #[command(flatten)]
        timings: TimingFlags,
        /// Do it.
        #[arg(long)]
        yes: bool,
    },
    /// Show the quotas of the token coordctl uses (groups, shards and members per group, request rate) and how
    /// much of each it uses; a coordinator without tokens shows no limit.
    Quota,
    /// Show a stream's routing: shard count, routing version, revision, routing lease.
    Routing {
        /// Stream name.
        stream: String,
    },
    /// Print the Redis keys of one shard (its stream, dead-letter stream, fence) and their hash slot, computed
    /// locally (no coordinator is asked): shard keys carry a slot-choosing salt (see docs/cluster.md).
    Keys {
        /// Stream name.
        stream: String,
        /// Shard number.
        shard: u32,
    },
}

/// What `coordctl keys` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ShardKeys {
    shard_stream: String,
    dead_letter: String,
    fence: String,
    slot: u16,
}

fn shard_keys(stream: &str, shard: u32) -> Result<ShardKeys, CliError> {
    let stream = protocol::names::StreamName::new(stream).map_err(|e| CliError::Refused(e.to_string()))?;
    let shard = protocol::ShardId(shard);
    Ok(ShardKeys {
        shard_stream: protocol::keys::shard_stream(&stream, shard),
        dead_letter: protocol::keys::dead_letter_stream(&stream, shard),
        fence: protocol::keys::shard_fence(&stream, shard),
        slot: protocol::keys::shard_slot(&stream, shard),
    })
}

/// A group's timings for `create` and `recreate`: all four, or none for the coordinator's defaults.
#[derive(Debug, clap::Args)]
struct TimingFlags {
    /// Member lease TTL in ms (give all four timings, or none for the coordinator's defaults).
    #[arg(long)]
    member_ttl_ms: Option<u64>,
    /// Heartbeat interval in ms.
    #[arg(long)]
    heartbeat_interval_ms: Option<u64>,
    /// Rebalance timeout in ms.
    #[arg(long)]
    rebalance_timeout_ms: Option<u64>,
    /// Consumer assignment lease in ms (at most the member TTL).
    #[arg(long)]
    assignment_lease_ms: Option<u64>,
}

impl TimingFlags {
    fn timings(&self) -> Result<Option<GroupTimings>, CliError> {
        match (
            self.member_ttl_ms,
            self.heartbeat_interval_ms,
            self.rebalance_timeout_ms,
            self.assignment_lease_ms,
        ) {
            (None, None, None, None) => Ok(None),
            (Some(ttl), Some(hb), Some(rb), Some(lease)) => Ok(Some(GroupTimings {
                member_ttl_ms: ttl,
                heartbeat_interval_ms: hb,
                rebalance_timeout_ms: rb,
                assignment_lease_ms: lease,
            })),
            _ => Err(CliError::Refused(
                "give all four timings (--member-ttl-ms --heartbeat-interval-ms --rebalance-timeout-ms \
                 --assignment-lease-ms) or none"
                    .into(),
            )),
        }
    }
}

/// `coordctl describe --json`: the group and, when the coordinator's `/metrics` is readable, the lag per shard.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Described {
    group: protocol::messages::GroupDescription,
    #[serde(skip_serializing_if = "Option::is_none")]
    lag: Option<Vec<output::ShardLag>>,
}

/// What `recreate` without `--yes` prints with `--json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RecreatePlan {
    stream: String,
    group: String,
    shard_count: u32,
    timings: Option<GroupTimings>,
    current: String,
    done: bool,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                if let CliError::Admin(AdminError::Api { http, body }) = &e {
                    let v = serde_json::json!({ "httpStatus": http, "error": body });
                    println!("{v}");
                }
            }
            eprintln!("coordctl: {}", client::error_chain(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

/// The token of `--token-file`, else of `--token` / `COORD_ADMIN_TOKEN`.
fn token(cli: &Cli) -> Result<Option<String>, CliError> {
    let Some(path) = &cli.token_file else {
        return Ok(cli.token.clone());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Refused(format!("cannot read the token file {}: {e}", path.display())))?;
    match text.trim() {
        "" => Err(CliError::Refused(format!("the token file {} is empty", path.display()))),
        token => Ok(Some(token.to_owned())),
    }
}

/// The TLS settings of `--coordinator-tls-*` for an `https://` URL.
fn tls(cli: &Cli) -> client_core::TlsOptions {
    let mut tls = client_core::TlsOptions::new();
    if let Some(ca) = &cli.coordinator_tls_ca {
        tls = tls.ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&cli.coordinator_tls_cert, &cli.coordinator_tls_key) {
        tls = tls.client_identity(cert, key);
    }
    tls
}

/// Where the coordinator is when `--url` / `COORD_URL` is absent.
const DEFAULT_URL: &str = "http://127.0.0.1:7400";

/// `--url` / `COORD_URL`, else the deprecated `COORDINATOR_URL` (the examples' old name, a comma-separated list:
/// its first URL), else [`DEFAULT_URL`].
fn url(cli: &Cli) -> String {
    if let Some(url) = &cli.url {
        return url.clone();
    }
    let alias = std::env::var("COORDINATOR_URL").unwrap_or_default();
    match alias.split(',').map(str::trim).find(|u| !u.is_empty()) {
        Some(first) => {
            eprintln!("coordctl: COORDINATOR_URL is deprecated, use COORD_URL");
            first.to_owned()
        }
        None => DEFAULT_URL.to_owned(),
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    if let Command::Keys { stream, shard } = &cli.command {
        let keys = shard_keys(stream, *shard)?;
        emit(cli.json, &keys, || {
            format!(
                "shard stream  {}\ndead letters  {}\nfence         {}\nhash slot     {}\n",
                keys.shard_stream, keys.dead_letter, keys.fence, keys.slot
            )
        });
        return Ok(());
    }
    let client = AdminClient::new(&url(&cli), token(&cli)?, Duration::from_millis(cli.timeout_ms))?
        .coordinator_tls(tls(&cli))?;
    let json = cli.json;
    match cli.command {
        Command::Groups { rebuild } => {
            let list = client.list_groups(rebuild).await?;
            emit(json, &list, || output::groups(&list));
        }
        Command::Describe { stream, group } => {
            let g = client.describe(&stream, &group).await?;
            let lag = lag(&client, &stream, &group).await;
            let human = output::group(&g, lag.as_deref());
            emit(json, &Described { group: g, lag }, || human);
        }
        Command::Create {
            stream,
            group,
            shards,
            timings,
        } => {
            let req = CreateGroupRequest {
                shard_count: shards,
                timings: timings.timings()?,
            };
            let g = client.create(&stream, &group, &req).await?;
            let lag = lag(&client, &stream, &group).await;
            emit(json, &g, || format!("created\n\n{}", output::group(&g, lag.as_deref())));
        }
        Command::AddShards {
            stream,
            count,
            if_match,
        } => {
            let r = client.add_shards(&stream, count, if_match.map(StoreRevision)).await?;
            emit(json, &r, || format!("added {count} shard(s)\n{}", output::routing(&r)));
        }
        Command::Fence {
            stream,
            group,
            member,
            if_match,
        } => {
            let g = client
                .fence(&stream, &group, &member, if_match.map(StoreRevision))
                .await?;
            let lag = lag(&client, &stream, &group).await;
            emit(json, &g, || {
                format!(
                    "fenced {member}: it gets FENCED_MEMBER_EPOCH on its next heartbeat; its shards move when its lease \
                     ends\n\n{}",
                    output::group(&g, lag.as_deref())
                )
            });
        }
        recreate @ Command::Recreate { .. } => recreate_group(&client, json, recreate).await?,
        Command::Routing { stream } => {
            let r = client.routing(&stream).await?;
            emit(json, &r, || output::routing(&r));
        }
        Command::Quota => {
            let q = client.quota().await?;
            emit(json, &q, || output::quota(&q));
        }
        Command::Keys { .. } => unreachable!("answered before connecting"),
    }
    Ok(())
}

/// `coordctl recreate`: prints the plan without `--yes`, recreates with it.
async fn recreate_group(client: &AdminClient, json: bool, command: Command) -> Result<(), CliError> {
    let Command::Recreate {
        stream,
        group,
        shards,
        timings,
        yes,
    } = command
    else {
        unreachable!("called for recreate only")
    };
    let timings = timings.timings()?;
    if !yes {
        let current = match client.describe(&stream, &group).await {
            Ok(g) => format!("the group exists (revision {}): recreate will refuse", g.revision.0),
            Err(e) => e.to_string(),
        };
        let plan = RecreatePlan {
            stream: stream.clone(),
            group: group.clone(),
            shard_count: shards,
            timings,
            current: current.clone(),
            done: false,
        };
        emit(json, &plan, || recreate_plan(&plan));
        return Err(CliError::Refused(
            "not recreated: re-run with --yes after checking the plan".into(),
        ));
    }
    let req = RecreateGroupRequest {
        confirm: true,
        shard_count: shards,
        timings,
    };
    let g = client.recreate(&stream, &group, &req).await?;
    let lag = lag(client, &stream, &group).await;
    emit(json, &g, || {
        format!("recreated\n\n{}", output::group(&g, lag.as_deref()))
    });
    Ok(())
}

/// The group's per-shard lag from the coordinator's `/metrics`, `None` when that page cannot be read. Every
/// command that prints a group table reads it: the table says "not readable" when it is `None`.
async fn lag(client: &AdminClient, stream: &str, group: &str) -> Option<Vec<output::ShardLag>> {
    client
        .metrics()
        .await
        .map(|text| output::lag_from_metrics(&text, stream, group))
}

fn recreate_plan(p: &RecreatePlan) -> String {
    let timings = match &p.timings {
        None => "the coordinator's default timings".to_owned(),
        Some(t) => format!(
            "memberTtl {} ms, heartbeatInterval {} ms, rebalanceTimeout {} ms, assignmentLease {} ms",
            t.member_ttl_ms, t.heartbeat_interval_ms, t.rebalance_timeout_ms, t.assignment_lease_ms
        ),
    };
    format!(
        "PLAN: recreate group {group} of stream {stream} with {n} shard(s) and {timings}.\n\
         now: {current}\n\
         - allowed only while the group's metadata key is missing; the coordinator never rebuilds it from heartbeats;\n\
         - the new group starts at a metadata version above any the lost group had, with a correction round open:\n\
         \x20 no member gets OK for one member TTL (clients of the lost group may still hold leases);\n\
         - members of the lost group get UNKNOWN_MEMBER and rejoin;\n\
         - the stream's routing is created with {n} shard(s) if it is missing too; an existing routing must have {n}.\n\
         Do not recreate while the original data may still be restored (a wrong database, a Redis being recovered).\n\
         Re-run with --yes to do it.\n",
        group = p.group,
        stream = p.stream,
        n = p.shard_count,
        current = p.current,
    )
}

/// Prints `value` as JSON, or the human text.
fn emit<T: Serialize>(json: bool, value: &T, human: impl FnOnce() -> String) {
    if json {
        match serde_json::to_string_pretty(value) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("coordctl: cannot encode the answer: {e}"),
        }
    } else {
        print!("{}", human());
    }
}
