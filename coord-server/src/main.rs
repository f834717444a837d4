//! The `coord-server` binary: flags and environment into a [`Config`], logging, signals, and [`serve`].

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, ValueEnum};
use coord_server::auth::{self, Grant, Role};
use coord_server::config::redact_redis_target;
use coord_server::quota::Quota;
use coord_server::server::serve_with_probes;
use coord_server::{Config, Coordinator};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::{error, info, warn};

/// The redis-stream-coord coordinator: assigns the shards of sharded Redis Streams to the members of consumer
/// groups and serves producers their routing.
///
/// Unset timings keep the library defaults (see `coord_server::Config`).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Redis to use: one server's URL (redis://[user:password@]host:port[/db], rediss:// for TLS), or a Redis
    /// Cluster as `cluster:` followed by the comma-separated URLs of one or more of its nodes, e.g.
    /// cluster:redis://10.0.0.1:7000,redis://10.0.0.2:7000 (the other nodes are discovered; database 0 only;
    /// every node connection uses the first URL's credentials and TLS settings).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// A Redis of its own for the coordinator's metadata (group and routing hashes, liveness, mutexes, indexes),
    /// same forms as --redis-url, which then holds only the shard streams and their fences: stream data filling
    /// that Redis up cannot stop heartbeats. Unset: --redis-url holds everything.
    #[arg(long, env = "COORD_METADATA_REDIS_URL")]
    metadata_redis_url: Option<String>,
    /// HTTP listen address.
    #[arg(long, env = "COORD_LISTEN", default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// Listen address of the probe listener: /healthz, /readyz and /metrics on a port of their own, with
    /// connection slots of their own, so a flood of client connections cannot crowd out the probes (unset: none;
    /// the main port serves the three either way).
    #[arg(long, env = "COORD_PROBE_LISTEN")]
    probe_listen: Option<SocketAddr>,
    /// Serve HTTPS on --listen with this PEM certificate chain (with --tls-key). (`COORD_SERVER_TLS_*`, not
    /// `COORD_TLS_*`: those are the clients' CA and certificate, which may share an environment with these.) Reloaded when the file changes
    /// and on SIGHUP, so certificates rotate without a restart. The probe listener stays plain HTTP.
    #[arg(long, env = "COORD_SERVER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "COORD_SERVER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates issued by a CA of this PEM file (mutual TLS; needs --tls-cert).
    #[arg(long, env = "COORD_SERVER_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// How often the TLS files are checked for a change, in ms (default 5000).
    #[arg(long, env = "COORD_SERVER_TLS_RELOAD_INTERVAL_MS")]
    tls_reload_interval_ms: Option<u64>,
    /// How often the tick loop visits the groups that are due (expiry, fencing, routing adoption), in ms.
    #[arg(long, env = "COORD_TICK_INTERVAL_MS")]
    tick_interval_ms: Option<u64>,
    /// Every group is visited at least this often whatever the due index says (the safety sweep), in ms.
    #[arg(long, env = "COORD_DUE_SWEEP_PERIOD_MS")]
    due_sweep_period_ms: Option<u64>,
    /// Most decoded group aggregates cached in memory (least recently used dropped beyond it).
    #[arg(long, env = "COORD_MAX_CACHED_AGGREGATES")]
    max_cached_aggregates: Option<usize>,
    /// Default member lease TTL of new groups, in ms.
    #[arg(long, env = "COORD_MEMBER_TTL_MS")]
    member_ttl_ms: Option<u64>,
    /// Default heartbeat interval of new groups, in ms.
    #[arg(long, env = "COORD_HEARTBEAT_INTERVAL_MS")]
    heartbeat_interval_ms: Option<u64>,
    /// Default rebalance timeout of new groups (drain time before fencing), in ms.
    #[arg(long, env = "COORD_REBALANCE_TIMEOUT_MS")]
    rebalance_timeout_ms: Option<u64>,
    /// Default consumer assignment lease of new groups, in ms (at most the member TTL).
    #[arg(long, env = "COORD_ASSIGNMENT_LEASE_MS")]
    assignment_lease_ms: Option<u64>,
    /// Routing lease given to producers of new streams, in ms.
    #[arg(long, env = "COORD_ROUTING_LEASE_MS")]
    routing_lease_ms: Option<u64>,
    /// TTL of a group's Redis mutex, in ms: how long a section that died holding it blocks the group. With the
    /// critical-section timeout, at most the assignment lease of any group.
    #[arg(long, env = "COORD_MUTEX_TTL_MS")]
    mutex_ttl_ms: Option<u64>,
    /// How long a request waits for a group's busy mutex, in ms (shorter than the mutex TTL).
    #[arg(long, env = "COORD_CRITICAL_SECTION_TIMEOUT_MS")]
    critical_section_timeout_ms: Option<u64>,
    /// Deadline of one HTTP request, in ms.
    #[arg(long, env = "COORD_REQUEST_TIMEOUT_MS")]
    request_timeout_ms: Option<u64>,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "COORD_BODY_LIMIT_BYTES")]
    body_limit_bytes: Option<usize>,
    /// Bearer token required by admin endpoints (every stream). Without one, anyone who reaches the port can
    /// fence members, recreate groups and add shards. Prefer the environment or --admin-token-file: a flag's
    /// value is visible to every local user in /proc/PID/cmdline.
    #[arg(
        long,
        env = "COORD_ADMIN_TOKEN",
        hide_env_values = true,
        conflicts_with = "admin_token_file"
    )]
    admin_token: Option<String>,
    /// File holding the admin bearer token (surrounding whitespace ignored).
    #[arg(long, env = "COORD_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// Bearer token required by the consumer and producer endpoints (every stream). Prefer the environment or
    /// --client-token-file.
    #[arg(
        long,
        env = "COORD_CLIENT_TOKEN",
        hide_env_values = true,
        conflicts_with = "client_token_file"
    )]
    client_token: Option<String>,
    /// File holding the client bearer token (surrounding whitespace ignored).
    #[arg(long, env = "COORD_CLIENT_TOKEN_FILE")]
    client_token_file: Option<PathBuf>,
    /// Token table: one `role:prefix:token` per line (role admin, consumer or producer; prefix a stream-name
    /// prefix such as `tenant-a.`, or `*` for every stream; `#` comments), optionally followed by the token's
    /// name and quotas (`name=tenant-a groups=20 rate=200`). Once given, every API route needs a token. See
    /// docs/security.md.
    #[arg(long, env = "COORD_TOKENS_FILE")]
    tokens_file: Option<PathBuf>,
    /// Start although the listen address is not loopback and no admin token is set (admin routes open to
    /// anyone who reaches the port).
    #[arg(long, env = "COORD_INSECURE_NO_ADMIN_TOKEN")]
    insecure_no_admin_token: bool,
    /// Report ready and create groups although Redis's maxmemory-policy is not `noeviction` (Redis may then evict
    /// group metadata, liveness or a held mutex under memory pressure).
    #[arg(long, env = "COORD_ACCEPT_EVICTION_POLICY")]
    accept_eviction_policy: bool,
    /// How long a client may take to send a request head after its first byte, in ms.
    #[arg(long, env = "COORD_HEADER_READ_TIMEOUT_MS")]
    header_read_timeout_ms: Option<u64>,
    /// How long a connection may stay open with no request in progress, in ms.
    #[arg(long, env = "COORD_IDLE_TIMEOUT_MS")]
    idle_timeout_ms: Option<u64>,
    /// Most connections served at once, besides the probe reserve (default: 3/4 of the open-file limit).
    #[arg(long, env = "COORD_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Extra connections, beyond --max-connections, that serve only /healthz and /readyz.
    #[arg(long, env = "COORD_PROBE_CONNECTIONS")]
    probe_connections: Option<usize>,
    /// On shutdown, how long open requests get to be answered before the remaining connections are dropped, in ms.
    #[arg(long, env = "COORD_SHUTDOWN_GRACE_MS")]
    shutdown_grace_ms: Option<u64>,
    /// Default quota of every token: groups on the streams it reaches (a token table line may set its own with
    /// `groups=`; see docs/operations.md, "Quotas").
    #[arg(long, env = "COORD_QUOTA_GROUPS")]
    quota_groups: Option<u32>,
    /// Default quota of every token: shards of the stream a group reads (`shards=`).
    #[arg(long, env = "COORD_QUOTA_SHARDS_PER_GROUP")]
    quota_shards_per_group: Option<u32>,
    /// Default quota of every token: members of one group (`members=`).
    #[arg(long, env = "COORD_QUOTA_MEMBERS_PER_GROUP")]
    quota_members_per_group: Option<u32>,
    /// Default quota of every token: requests per second to this replica (`rate=`).
    #[arg(long, env = "COORD_QUOTA_REQUESTS_PER_SECOND")]
    quota_requests_per_second: Option<u32>,
    /// Default quota of every token: requests at once after being idle (`burst=`).
    #[arg(long, env = "COORD_QUOTA_REQUEST_BURST")]
    quota_request_burst: Option<u32>,
    /// Log output format (the level comes from RUST_LOG, default `info`).
    #[arg(long, env = "COORD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The trimmed content of a token file; an empty file is an error, not "no token".
fn read_token_file(path: &Path, what: &str) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the {what} file {}", path.display()))?;
    let token = text.trim();
    anyhow::ensure!(!token.is_empty(), "the {what} file {} is empty", path.display());
    Ok(token.to_owned())
}

impl Args {
    /// The default quotas: `defaults` with the flags given.
    fn quota(&self, defaults: Quota) -> Quota {
        Quota {
            groups: self.quota_groups.unwrap_or(defaults.groups),
            shards_per_group: self.quota_shards_per_group.unwrap_or(defaults.shards_per_group),
            members_per_group: self.quota_members_per_group.unwrap_or(defaults.members_per_group),
            requests_per_second: self.quota_requests_per_second.unwrap_or(defaults.requests_per_second),
            request_burst: self.quota_request_burst.unwrap_or(defaults.request_burst),
        }
    }

    fn config(&self) -> anyhow::Result<Config> {
        let mut config = Config::new(self.redis_url.clone());
        config.metadata_redis_url = self.metadata_redis_url.clone();
        config.listen = self.listen;
        config.probe_listen = self.probe_listen;
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            let mut tls = coord_server::ServerTls::new(cert, key);
            tls.client_ca_file = self.tls_client_ca.clone();
            config.tls = Some(tls);
        }
        if let Some(v) = self.tls_reload_interval_ms {
            config.tls_reload_interval = Duration::from_millis(v);
        }
        let ms = Duration::from_millis;
        if let Some(v) = self.tick_interval_ms {
            config.tick_interval = ms(v);
        }
        if let Some(v) = self.due_sweep_period_ms {
            config.due_sweep_period = ms(v);
        }
        if let Some(v) = self.max_cached_aggregates {
            config.max_cached_aggregates = v;
        }
        if let Some(v) = self.routing_lease_ms {
            config.routing_lease = ms(v);
        }
        if let Some(v) = self.mutex_ttl_ms {
            config.mutex_ttl = ms(v);
        }
        if let Some(v) = self.critical_section_timeout_ms {
            config.critical_section_timeout = ms(v);
        }
        if let Some(v) = self.request_timeout_ms {
            config.request_timeout = ms(v);
        }
        if let Some(v) = self.body_limit_bytes {
            config.body_limit_bytes = v;
        }
        if let Some(v) = self.header_read_timeout_ms {
            config.header_read_timeout = ms(v);
        }
        if let Some(v) = self.idle_timeout_ms {
            config.idle_timeout = ms(v);
        }
        if self.max_connections.is_some() {
            config.max_connections = self.max_connections;
        }
        if let Some(v) = self.probe_connections {
            config.probe_connections = v;
        }
        if let Some(v) = self.shutdown_grace_ms {
            config.shutdown_grace = ms(v);
        }
        let t = &mut config.default_timings;
        if let Some(v) = self.member_ttl_ms {
            t.member_ttl_ms = v;
        }
        if let Some(v) = self.heartbeat_interval_ms {
            t.heartbeat_interval_ms = v;
        }
        if let Some(v) = self.rebalance_timeout_ms {
            t.rebalance_timeout_ms = v;
        }
        if let Some(v) = self.assignment_lease_ms {
            t.assignment_lease_ms = v;
        }
        config.admin_token = match &self.admin_token_file {
            Some(path) => Some(read_token_file(path, "admin token")?),
            None => self.admin_token.clone().filter(|t| !t.is_empty()),
        };
        config.client_token = match &self.client_token_file {
            Some(path) => Some(read_token_file(path, "client token")?),
            None => self.client_token.clone().filter(|t| !t.is_empty()),
        };
        if let Some(path) = &self.tokens_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token table {}", path.display()))?;
            config.tokens = Grant::parse_table(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            anyhow::ensure!(
                !config.tokens.is_empty(),
                "the token table {} has no grant",
                path.display()
            );
        }
        config.quota = self.quota(config.quota);
        config.insecure_no_admin_token = self.insecure_no_admin_token;
        config.accept_eviction_policy = self.accept_eviction_policy;
        Ok(config)
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only help a person at a terminal; in a log collector they are noise.
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Completes on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            // Without a handler we could never shut down gracefully; keep running rather than exit at once.
            error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(e) => {
                error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => info!("SIGINT received"),
        () = terminate => info!("SIGTERM received"),
    }
}

/// Warns about tokens given as flags: every local user can read a process's command line.
fn warn_about_visible_tokens(matches: &ArgMatches) {
    for (id, flag) in [("admin_token", "--admin-token"), ("client_token", "--client-token")] {
        if matches.value_source(id) == Some(ValueSource::CommandLine) {
            warn!(
                "{flag} on the command line is visible to every local user (/proc/PID/cmdline, ps); use \
                 {flag}-file or the environment instead"
            );
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = args.config()?;
    // Checked here too so a bad flag is reported as such, not as a failure to reach Redis.
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    if !auth::role_is_protected(config.credentials(), Role::Admin) {
        warn!(
            "NO ADMIN TOKEN (--admin-token-file / COORD_ADMIN_TOKEN / --tokens-file): anyone who reaches {} can \
             fence members, recreate groups and add shards",
            config.listen
        );
    }
    if !auth::role_is_protected(config.credentials(), Role::Consumer) && !config.listen.ip().is_loopback() {
        warn!(
            "no client token: anyone who reaches {} can join any group and fetch any stream's routing",
            config.listen
        );
    }
    if let Some(tls) = &config.tls {
        coord_server::server::tls::check(tls).context("cannot serve HTTPS")?;
    }
    let (listen, probe_listen) = (config.listen, config.probe_listen);
    let coordinator = Coordinator::connect(config)
        .await
        .with_context(|| format!("cannot start against Redis at {}", redact_redis_target(&args.redis_url)))?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    info!(addr = %listener.local_addr().unwrap_or(listen), "coordinator listening");
    let probes = match probe_listen {
        Some(at) => {
            let probes = TcpListener::bind(at)
                .await
                .with_context(|| format!("cannot listen for probes on {at}"))?;
            info!(addr = %probes.local_addr().unwrap_or(at), "probe listener");
            Some(probes)
        }
        None => None,
    };
    serve_with_probes(coordinator, listener, probes, shutdown_signal())
        .await
        .context("HTTP server failed")?;
    info!("coordinator stopped");
    Ok(())
}

/// The binary's allocator (feature `jemalloc`, on by default): see the feature's note in `Cargo.toml`.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    init_logging(args.log_format);
    warn_about_visible_tokens(&matches);
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Plain stderr as well as the log: an operator reading a crash loop sees the reason first.
            error!("{e:#}");
            eprintln!("coord-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}
