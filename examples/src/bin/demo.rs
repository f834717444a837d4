//! The demo: a whole consumer group on one machine, with a crash and a join in the middle.
//!
//! ```text
//! cargo run --release -p examples --bin demo
//! ```
//!
//! 1. Redis: `--redis-url` / `REDIS_URL` when given, else a private `redis-server` from `PATH` on a free loopback
//!    port (persistence off, killed at the end; see `examples::redis_launcher`).
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
//!    processed, closes everything gracefully, and prints the summary. Definitions of processed, redelivered and
//!    order violation: `examples::ledger`.
//!
//! With `--redis-url` the demo's stream (`demo-<unique>`: 8 shard streams and the group's metadata) stays in that
//! Redis afterwards.
//!
//! Exit status: 0 all checks passed; 1 a check failed (an acknowledged record was never processed, an order
//! violation, a rebalance not observed before the deadline); 2 setup failed (no `redis-server`, coordinator
//! unreachable, ...); 130 interrupted.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use coord_server::server::CoordinatorHandle;
use examples::ledger::{Ledger, LedgerCounts, PublishState};
use examples::redis_launcher::RedisLauncher;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use protocol::messages::CreateGroupRequest;
use protocol::metadata::GroupTimings;
use stream_consumer::{Consumer, ConsumerHandle, ConsumerStatus, Message, RebalanceListener, ShardId};
use stream_producer::{Producer, Record, WriteState};
use tokio::sync::watch;

/// Shards of the demo stream.
const SHARDS: u32 = 8;
/// Consumers at the start.
const CONSUMERS: usize = 3;
/// Producers.
const PRODUCERS: usize = 2;
/// Most records per `send_batch`.
const MAX_BATCH: usize = 500;
/// Publishing ticks per second when rate-limited.
const TICKS_PER_SECOND: u64 = 100;

#[derive(Parser, Debug)]
#[command(about = "redis-stream-coord demo: 3 consumers, 2 producers, a crash and a join, then a summary")]
struct Args {
    /// Redis to use instead of starting a private redis-server; the demo leaves a `demo-*` stream in it. Only this
    /// flag selects it: an exported `REDIS_URL` is ignored (and said so), so that the demo never writes into a
    /// Redis by accident.
    #[arg(long)]
    redis_url: Option<String>,
    /// An external coordinator instead of the in-process one; it must use the Redis of --redis-url. Flag only, as
    /// --redis-url.
    #[arg(long, requires = "redis_url")]
    coordinator_url: Option<String>,
    /// Admin bearer token of the external coordinator (to create the group), if it requires one.
    #[arg(long, env = "COORD_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Client bearer token of the external coordinator, if it requires one (the deprecated `COORDINATOR_TOKEN`
    /// is read too).
    #[arg(long, env = "COORD_CLIENT_TOKEN", hide_env_values = true)]
    coordinator_token: Option<String>,
    /// Records to publish [default: 200000; 5000 with --short].
    #[arg(long)]
    records: Option<u64>,
    /// Publishing rate of both producers together, records/s; 0: as fast as possible [default: 20000; 1000 with
    /// --short].
    #[arg(long)]
    rate: Option<u64>,
    /// Distinct keys.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// Stream name [default: demo-<unique>].
    #[arg(long)]
    stream: Option<String>,
    /// Consumer group name.
    #[arg(long, default_value = "demo")]
    group: String,
    /// A small, fast run (CI): 5000 records at 1000/s, member TTL 2 s.
    #[arg(long)]
    short: bool,
    /// Plain log lines instead of progress bars (automatic when stdout is not a terminal).
    #[arg(long)]
    no_progress: bool,
    /// How long to wait after publishing for every record to be processed, in seconds [default: 60; 20 with
    /// --short].
    #[arg(long)]
    deadline_secs: Option<u64>,
}

/// The run's settings, defaults applied.
#[derive(Debug, Clone)]
struct Settings {
    records: u64,
    rate: u64,
    keys: u64,
    stream: String,
    group: String,
    timings: GroupTimings,
    deadline: Duration,
    progress: bool,
    coordinator_token: Option<String>,
}

impl Settings {
    fn new(args: &Args) -> Result<Settings> {
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

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn member_ttl(&self) -> Duration {
        Self::ms(self.timings.member_ttl_ms)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Output: progress bars or plain lines.

/// Where the demo writes while it runs.
struct Output {
    multi: MultiProgress,
    bars: Option<Bars>,
    start: Instant,
    records: u64,
}

struct Bars {
    published: ProgressBar,
    processed: ProgressBar,
    members: ProgressBar,
}

impl Output {
    fn new(multi: MultiProgress, progress: bool, records: u64) -> Output {
        let bars = progress.then(|| {
            let style = ProgressStyle::with_template("{prefix:>10} [{bar:40.cyan/blue}] {pos:>7}/{len:7} {msg}")
                .expect("valid template")
                .progress_chars("=> ");
            let bar = |name: &str| {
                let b = multi.add(ProgressBar::new(records));
                b.set_style(style.clone());
                b.set_prefix(name.to_owned());
                b
            };
            let published = bar("published");
            let processed = bar("processed");
            let members = multi.add(ProgressBar::new_spinner());
            members.set_style(ProgressStyle::with_template("{prefix:>10} {msg}").expect("valid template"));
            members.set_prefix("shards");
            Bars {
                published,
                processed,
                members,
            }
        });
        Output {
            multi,
            bars,
            start: Instant::now(),
            records,
        }
    }

    fn secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// One event line (above the bars, or on stdout).
    fn event(&self, msg: impl std::fmt::Display) {
        let line = format!("[{:>6.2}s] {msg}", self.secs());
        if self.bars.is_some() {
            let _ = self.multi.println(line);
        } else {
            println!("{line}");
        }
    }

    /// Updates the bars, or prints a status line when `plain_line` (plain mode, once a second).
    /// `(count, seconds)` published and processed: seconds since publishing started, until it ended for the
    /// published count (for the rates).
    fn status(&self, published: (u64, f64), processed: (u64, f64), members: &str, plain_line: bool) {
        let rate = |(n, secs): (u64, f64)| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let ((published_n, _), (processed_n, _)) = (published, processed);
        match &self.bars {
            Some(b) => {
                b.published.set_position(published_n);
                b.published.set_message(format!("{:>7.0} records/s", rate(published)));
                b.processed.set_position(processed_n);
                b.processed.set_message(format!("{:>7.0} records/s", rate(processed)));
                b.members.set_message(members.to_owned());
            }
            None if plain_line => println!(
                "[{:>6.2}s] published {published_n}/{n} processed {processed_n}/{n} | shards: {members}",
                self.secs(),
                n = self.records
            ),
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bars {
            b.published.finish();
            b.processed.finish();
            b.members.finish();
        }
    }
}

/// Log lines go through the progress bars (suspended while one is written), so they do not garble them.
#[derive(Clone)]
struct LogWriter(MultiProgress);

struct LogEvent {
    multi: MultiProgress,
    buf: Vec<u8>,
}

impl std::io::Write for LogEvent {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogEvent {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.multi.suspend(|| {
            let _ = std::io::stderr().write_all(&buf);
        });
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogEvent;

    fn make_writer(&'a self) -> LogEvent {
        LogEvent {
            multi: self.0.clone(),
            buf: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The board: what every member reads, and the two rebalances being timed.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Running,
    Crashed,
    Closed,
}

#[derive(Debug)]
struct MemberView {
    name: String,
    fate: Fate,
    reading: Vec<ShardId>,
    pending: Vec<ShardId>,
    lost: u64,
}

#[derive(Debug)]
struct CrashWatch {
    member: usize,
    at: Instant,
    shards: Vec<ShardId>,
    first_moved: Option<Instant>,
    all_moved: Option<Instant>,
}

#[derive(Debug)]
struct JoinWatch {
    member: usize,
    at: Instant,
    first_shard: Option<(Instant, ShardId)>,
}

#[derive(Debug, Default)]
struct Board {
    members: BTreeMap<usize, MemberView>,
    crash: Option<CrashWatch>,
    join: Option<JoinWatch>,
}

fn shard_list(shards: &[ShardId]) -> String {
    let list: Vec<String> = shards.iter().map(ToString::to_string).collect();
    format!("[{}]", list.join(" "))
}

impl Board {
    /// Applies a member's new status; returns the events to print.
    fn update(&mut self, member: usize, status: &ConsumerStatus) -> Vec<String> {
        let mut events = Vec::new();
        let Some(view) = self.members.get_mut(&member) else {
            return events;
        };
        if view.fate != Fate::Running {
            return events;
        }
        view.pending = status.pending.clone();
        if view.reading != status.reading {
            view.reading = status.reading.clone();
            events.push(format!(
                "{} reads {} shard(s) {}",
                view.name,
                view.reading.len(),
                shard_list(&view.reading)
            ));
        }
        events.extend(self.check());
        events
    }

    /// Whether a running member other than `except` reads `shard`.
    fn read_elsewhere(&self, shard: ShardId, except: usize) -> bool {
        self.members
            .iter()
            .any(|(&m, v)| m != except && v.fate == Fate::Running && v.reading.contains(&shard))
    }

    /// Times the rebalances that completed.
    fn check(&mut self) -> Vec<String> {
        let mut events = Vec::new();
        let now = Instant::now();
        if let Some(c) = &self.crash {
            if c.all_moved.is_none() {
                let moved = c.shards.iter().filter(|&&s| self.read_elsewhere(s, c.member)).count();
                let (member, at, total) = (c.member, c.at, c.shards.len());
                let name = self.members[&member].name.clone();
                let c = self.crash.as_mut().expect("checked above");
                if moved > 0 && c.first_moved.is_none() {
                    c.first_moved = Some(now);
                }
                if moved == total {
                    c.all_moved = Some(now);
                    events.push(format!(
                        "REBALANCED: all {total} shard(s) of crashed {name} are read by other members, {:.2} s after \
                         the crash",
                        (now - at).as_secs_f64()
                    ));
                }
            }
        }
        if let Some(j) = &mut self.join {
            if j.first_shard.is_none() {
                let view = &self.members[&j.member];
                if let Some(&shard) = view.reading.first() {
                    j.first_shard = Some((now, shard));
                    events.push(format!(
                        "JOINED: {} reads its first shard ({shard}), {:.2} s after joining",
                        view.name,
                        (now - j.at).as_secs_f64()
                    ));
                }
            }
        }
        events
    }

    /// One line: shards per member.
    fn line(&self) -> String {
        let parts: Vec<String> = self
            .members
            .values()
            .map(|v| match v.fate {
                Fate::Running if v.pending.is_empty() => {
                    format!("{}: {} {}", v.name, v.reading.len(), shard_list(&v.reading))
                }
                Fate::Running => format!(
                    // Assigned here, but the previous owner has not released them yet.
                    "{}: {} {} (+{} awaiting handover)",
                    v.name,
                    v.reading.len(),
                    shard_list(&v.reading),
                    v.pending.len()
                ),
                Fate::Crashed => format!("{}: CRASHED", v.name),
                Fate::Closed => format!("{}: closed", v.name),
            })
            .collect();
        parts.join(" | ")
    }

    fn rebalanced(&self) -> bool {
        self.crash.as_ref().is_some_and(|c| c.all_moved.is_some())
            && self.join.as_ref().is_some_and(|j| j.first_shard.is_some())
    }
}

/// Reports shards lost without a drain (should not happen in the demo: only the crashed member loses shards,
/// and it is gone).
struct LostListener {
    member: usize,
    board: Arc<Mutex<Board>>,
    out: Arc<Output>,
}

impl RebalanceListener for LostListener {
    async fn on_lost(&self, shards: Vec<ShardId>) {
        let name = {
            let mut board = self.board.lock().expect("board lock");
            let Some(view) = board.members.get_mut(&self.member) else {
                return;
            };
            view.lost += shards.len() as u64;
            view.name.clone()
        };
        self.out.event(format!(
            "{name} LOST shards {} (fenced, forgotten or lease expired)",
            shard_list(&shards)
        ));
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The run.

/// Everything the consumers share.
#[derive(Clone)]
struct Shared {
    settings: Arc<Settings>,
    coordinator_url: String,
    redis_url: String,
    ledger: Arc<Mutex<Ledger>>,
    board: Arc<Mutex<Board>>,
    out: Arc<Output>,
}

fn spawn_consumer(shared: &Shared, member: usize) -> Result<ConsumerHandle> {
    let s = &shared.settings;
    let name = format!("consumer-{}", member + 1);
    let ms = Settings::ms;
    let ledger = Arc::clone(&shared.ledger);
    let mut builder = Consumer::builder(&s.stream, &s.group)
        .coordinator(&shared.coordinator_url)
        .redis(&shared.redis_url)
        .member_id(&name)
        .heartbeat_interval(ms(s.timings.heartbeat_interval_ms))
        .member_ttl(ms(s.timings.member_ttl_ms))
        .assignment_lease(ms(s.timings.assignment_lease_ms))
        .lease_safety_margin(ms(s.timings.assignment_lease_ms / 5))
        .request_timeout(ms(s.timings.assignment_lease_ms / 2))
        .read_block(Duration::from_millis(250))
        .drain_timeout(Duration::from_secs(5))
        .rebalance_listener(LostListener {
            member,
            board: Arc::clone(&shared.board),
            out: Arc::clone(&shared.out),
        })
        .handler(move |msg: Message| {
            // The work is done when the handler is called; the entry is acknowledged after the returned future.
            ledger.lock().expect("ledger lock").handle(
                member,
                msg.get_str("key"),
                msg.get_str("seq"),
                msg.delivery_count(),
            );
            std::future::ready(Ok::<_, Infallible>(()))
        });
    if let Some(token) = &s.coordinator_token {
        builder = builder.coordinator_token(token);
    }
    let handle = builder.build().context("consumer configuration")?.spawn();
    shared.board.lock().expect("board lock").members.insert(
        member,
        MemberView {
            name,
            fate: Fate::Running,
            reading: Vec::new(),
            pending: Vec::new(),
            lost: 0,
        },
    );
    tokio::spawn(watch_member(
        handle.watch_status(),
        member,
        Arc::clone(&shared.board),
        Arc::clone(&shared.out),
    ));
    Ok(handle)
}

async fn watch_member(
    mut status: watch::Receiver<ConsumerStatus>,
    member: usize,
    board: Arc<Mutex<Board>>,
    out: Arc<Output>,
) {
    loop {
        let current = status.borrow_and_update().clone();
        let events = board.lock().expect("board lock").update(member, &current);
        for e in events {
            out.event(e);
        }
        if current.closed || status.changed().await.is_err() {
            return;
        }
    }
}

/// Publishes the records of producer `p` (the keys `k` with `k % PRODUCERS == p`, in record order).
async fn publish(
    p: usize,
    producer: Arc<Producer>,
    settings: Arc<Settings>,
    ledger: Arc<Mutex<Ledger>>,
    attempted: Arc<AtomicU64>,
) -> Result<()> {
    let keys = settings.keys;
    let mut mine = (0..settings.records)
        .filter(move |i| (i % keys) as usize % PRODUCERS == p)
        .peekable();
    let per_tick = settings.rate as f64 / PRODUCERS as f64 / TICKS_PER_SECOND as f64;
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / TICKS_PER_SECOND));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut owed = 0f64;
    while mine.peek().is_some() {
        let due = if settings.rate == 0 {
            MAX_BATCH
        } else {
            tick.tick().await;
            owed += per_tick;
            let due = owed.floor();
            owed -= due;
            due as usize
        };
        let mut sent = 0;
        while sent < due {
            let batch: Vec<u64> = mine.by_ref().take((due - sent).min(MAX_BATCH)).collect();
            if batch.is_empty() {
                break;
            }
            sent += batch.len();
            let records = batch
                .iter()
                .map(|&i| {
                    let key = Ledger::key_name(i % keys);
                    Record::with_key(key.as_str())
                        .field("key", key)
                        .field("seq", (i / keys).to_string())
                })
                .collect();
            let states: Vec<PublishState> = match producer.send_batch(records).await {
                Ok(_) => vec![PublishState::Written; batch.len()],
                Err(e) => e
                    .outcomes()
                    .iter()
                    .map(|o| match o.write_state() {
                        WriteState::Written => PublishState::Written,
                        WriteState::NotWritten => PublishState::NotWritten,
                        WriteState::Unknown => PublishState::Unknown,
                    })
                    .collect(),
            };
            let mut ledger = ledger.lock().expect("ledger lock");
            for (&i, state) in batch.iter().zip(states) {
                ledger.published(i, state);
            }
            drop(ledger);
            attempted.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Creates the stream's group through the admin API.
async fn create_group(url: &str, settings: &Settings, admin_token: Option<&str>) -> Result<()> {
    let endpoint = format!("{url}{}", protocol::routes::group(&settings.stream, &settings.group));
    let body = CreateGroupRequest {
        shard_count: Some(SHARDS),
        timings: Some(settings.timings),
    };
    let mut request = reqwest::Client::new()
        .post(&endpoint)
        .timeout(Duration::from_secs(10))
        .json(&body);
    if let Some(token) = admin_token.filter(|t| !t.is_empty()) {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("cannot reach the coordinator at {}", protocol::redact::redact_url(url)))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        bail!("creating the group (POST {endpoint}) failed: {status}: {text}");
    }
    Ok(())
}

/// What the run measured.
struct Report {
    settings: Arc<Settings>,
    counts: LedgerCounts,
    missing: u64,
    unacknowledged_processed: u64,
    violations: Vec<examples::ledger::Violation>,
    members: Vec<MemberRow>,
    crash: Option<CrashRow>,
    join: Option<JoinRow>,
    publish_secs: f64,
    process_secs: f64,
    total_secs: f64,
    deadline_passed: bool,
    coordinator: String,
    redis: String,
}

struct MemberRow {
    name: String,
    fate: Fate,
    reading_at_end: Vec<ShardId>,
    handled: u64,
    claimed: u64,
    lost: u64,
}

struct CrashRow {
    name: String,
    shards: Vec<ShardId>,
    first_moved: Option<Duration>,
    all_moved: Option<Duration>,
}

struct JoinRow {
    name: String,
    first_shard: Option<(Duration, ShardId)>,
}

impl Report {
    fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.missing > 0 {
            f.push(format!("{} acknowledged record(s) never processed", self.missing));
        }
        if self.counts.violations > 0 {
            f.push(format!("{} order violation(s)", self.counts.violations));
        }
        if self.counts.foreign > 0 {
            f.push(format!(
                "{} entries that are not records of this run",
                self.counts.foreign
            ));
        }
        if self.counts.written == 0 {
            f.push("nothing was published".into());
        }
        if self.crash.as_ref().is_none_or(|c| c.all_moved.is_none()) {
            f.push("the crashed member's shards were not all read elsewhere before the deadline".into());
        }
        if self.join.as_ref().is_none_or(|j| j.first_shard.is_none()) {
            f.push("the new member read no shard before the deadline".into());
        }
        f
    }

    fn print(&self) {
        let c = &self.counts;
        let s = &self.settings;
        let secs = |d: Option<Duration>| d.map_or("not observed".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
        let rate = |n: u64, secs: f64| {
            if secs > 0.0 {
                format!("{:.0}", n as f64 / secs)
            } else {
                "-".into()
            }
        };
        let ttl = s.member_ttl().as_secs_f64();
        let mut rows: Vec<(String, String, String)> = Vec::new();
        let mut row = |m: &str, v: String, n: String| rows.push((m.to_owned(), v, n));
        row(
            "records published (acknowledged)",
            c.written.to_string(),
            format!("of {} to publish; {} keys, {PRODUCERS} producers", s.records, s.keys),
        );
        row(
            "publish failures",
            (c.not_written + c.unknown).to_string(),
            format!("{} not written, {} unknown", c.not_written, c.unknown),
        );
        row(
            "records processed",
            c.distinct.to_string(),
            "distinct records the handler ran for".into(),
        );
        row(
            "missing",
            self.missing.to_string(),
            "acknowledged but never processed (must be 0)".into(),
        );
        row(
            "processed, not acknowledged",
            self.unacknowledged_processed.to_string(),
            "publish outcome unknown, yet written".into(),
        );
        row(
            "handler calls",
            c.handlings.to_string(),
            format!("{} with a delivery count >= 2 (claimed)", c.claimed),
        );
        row(
            "redelivered",
            c.redelivered.to_string(),
            "records processed more than once".into(),
        );
        row(
            "out-of-order redeliveries",
            c.excused.to_string(),
            "key order regressed on a redelivered record (allowed)".into(),
        );
        row(
            "order violations",
            c.violations.to_string(),
            "key order regressed outside redeliveries (must be 0)".into(),
        );
        match &self.crash {
            Some(cr) => {
                row(
                    "rebalance: crash -> first shard moved",
                    secs(cr.first_moved),
                    format!("{} aborted while reading {}", cr.name, shard_list(&cr.shards)),
                );
                row(
                    "rebalance: crash -> all shards moved",
                    secs(cr.all_moved),
                    format!("bounded below by the member TTL ({ttl} s)"),
                );
            }
            None => row("rebalance: crash", "not done".into(), String::new()),
        }
        match &self.join {
            Some(j) => row(
                "rebalance: join -> first shard read",
                secs(j.first_shard.map(|(d, _)| d)),
                match j.first_shard {
                    Some((_, shard)) => format!("{} started with shard {shard}", j.name),
                    None => j.name.clone(),
                },
            ),
            None => row("rebalance: join", "not done".into(), String::new()),
        }
        row(
            "throughput: published",
            rate(c.written, self.publish_secs),
            format!(
                "records/s over {:.2} s (limit {})",
                self.publish_secs,
                if s.rate == 0 {
                    "none".to_owned()
                } else {
                    format!("{}/s", s.rate)
                }
            ),
        );
        row(
            "throughput: processed",
            rate(c.distinct, self.process_secs),
            format!(
                "records/s over {:.2} s (first publish to last record)",
                self.process_secs
            ),
        );
        row(
            "wall time",
            format!("{:.2} s", self.total_secs),
            "start to summary".into(),
        );

        let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max("metric".len());
        let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max("value".len());
        let w2 = rows.iter().map(|r| r.2.len()).max().unwrap_or(0).max("note".len());
        let rule = format!("+-{}-+-{}-+-{}-+", "-".repeat(w0), "-".repeat(w1), "-".repeat(w2));
        let mut t = String::new();
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "Summary: stream {} ({SHARDS} shards), group {}; coordinator {}; redis {}",
            s.stream, s.group, self.coordinator, self.redis
        );
        let _ = writeln!(t, "{rule}");
        let _ = writeln!(t, "| {:<w0$} | {:>w1$} | {:<w2$} |", "metric", "value", "note");
        let _ = writeln!(t, "{rule}");
        for (m, v, n) in &rows {
            let _ = writeln!(t, "| {m:<w0$} | {v:>w1$} | {n:<w2$} |");
        }
        let _ = writeln!(t, "{rule}");
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "{:<12} {:<9} {:>10} {:>9} {:>6}  shards at the end",
            "member", "fate", "handled", "claimed", "lost"
        );
        for m in &self.members {
            let fate = match m.fate {
                Fate::Running => "running",
                Fate::Crashed => "crashed",
                Fate::Closed => "closed",
            };
            let _ = writeln!(
                t,
                "{:<12} {:<9} {:>10} {:>9} {:>6}  {}",
                m.name,
                fate,
                m.handled,
                m.claimed,
                m.lost,
                shard_list(&m.reading_at_end)
            );
        }
        let _ = writeln!(
            t,
            "claimed: entries a crashed member had read but not handled, taken over by the next owner (delivery count \
             >= 2); redelivered: records processed twice (usually 0: even a crash acknowledges what was handled)"
        );
        for v in &self.violations {
            let _ = writeln!(
                t,
                "violation: consumer-{} handled key-{} seq {} after seq {} (delivery count {})",
                v.member + 1,
                v.key,
                v.seq,
                v.seen,
                v.delivery_count
            );
        }
        if self.deadline_passed {
            let _ = writeln!(
                t,
                "the deadline ({} s after publishing) passed before everything was processed",
                s.deadline.as_secs()
            );
        }
        let failures = self.failures();
        if failures.is_empty() {
            let _ = writeln!(t, "RESULT: PASS");
        } else {
            let _ = writeln!(t, "RESULT: FAIL: {}", failures.join("; "));
        }
        print!("{t}");
    }
}

async fn run(
    args: &Args,
    settings: Arc<Settings>,
    redis_url: String,
    redis_label: String,
    out: Arc<Output>,
) -> Result<Report> {
    let start = out.start;
    // Coordinator.
    let (coordinator_url, coordinator, coordinator_label) =
        match args.coordinator_url.as_deref().filter(|u| !u.is_empty()) {
            Some(url) => {
                let url = url.trim_end_matches('/').to_owned();
                (
                    url.clone(),
                    None,
                    format!("{} (external)", protocol::redact::redact_url(&url)),
                )
            }
            None => {
                let mut config = coord_server::Config::new(redis_url.clone());
                config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
                config.tick_interval = Duration::from_millis(100);
                // Short enough for the demo's leases (`Config::check_timings`).
                config.mutex_ttl = Duration::from_millis(900);
                config.critical_section_timeout = Duration::from_millis(600);
                config.default_timings = settings.timings;
                let handle = CoordinatorHandle::spawn(config)
                    .await
                    .context("cannot start the in-process coordinator")?;
                let url = handle.url();
                (url.clone(), Some(handle), format!("{url} (in-process)"))
            }
        };
    create_group(&coordinator_url, &settings, args.admin_token.as_deref()).await?;
    let t = &settings.timings;
    out.event(format!(
        "redis {redis_label}; coordinator {coordinator_label}; stream {} with {SHARDS} shards, group {} (member TTL \
         {} ms, heartbeat {} ms, lease {} ms)",
        settings.stream, settings.group, t.member_ttl_ms, t.heartbeat_interval_ms, t.assignment_lease_ms
    ));

    let shared = Shared {
        settings: Arc::clone(&settings),
        coordinator_url: coordinator_url.clone(),
        redis_url: redis_url.clone(),
        ledger: Arc::new(Mutex::new(Ledger::new(settings.records, settings.keys))),
        board: Arc::new(Mutex::new(Board::default())),
        out: Arc::clone(&out),
    };
    let mut consumers: BTreeMap<usize, ConsumerHandle> = BTreeMap::new();
    for m in 0..CONSUMERS {
        consumers.insert(m, spawn_consumer(&shared, m)?);
    }
    out.event(format!("{CONSUMERS} consumers started (consumer-1..{CONSUMERS})"));

    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let mut builder = Producer::builder(settings.stream.as_str())
            .coordinator(coordinator_url.as_str())
            .redis(redis_url.as_str());
        if let Some(token) = &settings.coordinator_token {
            builder = builder.coordinator_token(token.as_str());
        }
        let producer = builder.build().context("producer configuration")?;
        producer
            .ready()
            .await
            .context("the producer cannot fetch its routing")?;
        producers.push(Arc::new(producer));
    }
    let attempted = Arc::new(AtomicU64::new(0));
    out.event(format!(
        "{PRODUCERS} producers publishing {} records at {}",
        settings.records,
        if settings.rate == 0 {
            "full speed".to_owned()
        } else {
            format!("{} records/s", settings.rate)
        }
    ));
    let publish_start = Instant::now();
    let mut publishers: Vec<_> = producers
        .iter()
        .enumerate()
        .map(|(p, producer)| {
            tokio::spawn(publish(
                p,
                Arc::clone(producer),
                Arc::clone(&settings),
                Arc::clone(&shared.ledger),
                Arc::clone(&attempted),
            ))
        })
        .collect();

    let plain_every = Duration::from_secs(1);
    let mut last_plain = Instant::now();
    let mut crashed = false;
    let publish_done: std::cell::Cell<Option<f64>> = std::cell::Cell::new(None);
    let show = |force_plain: bool, last_plain: &mut Instant| {
        let processed = shared.ledger.lock().expect("ledger lock").counts().distinct;
        let line = shared.board.lock().expect("board lock").line();
        let plain = force_plain || last_plain.elapsed() >= plain_every;
        if plain {
            *last_plain = Instant::now();
        }
        let secs = publish_start.elapsed().as_secs_f64();
        let published = (attempted.load(Ordering::Relaxed), publish_done.get().unwrap_or(secs));
        out.status(published, (processed, secs), &line, plain);
    };

    // Publishing, with the crash and the join halfway.
    loop {
        let done = publishers.iter().all(|p| p.is_finished());
        if !crashed && (done || attempted.load(Ordering::Relaxed) >= settings.records / 2) {
            crashed = true;
            show(true, &mut last_plain);
            crash_and_join(&shared, &mut consumers).await?;
        }
        if done {
            break;
        }
        show(false, &mut last_plain);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for p in publishers.drain(..) {
        p.await.context("a publishing task failed")??;
    }
    let publish_secs = publish_start.elapsed().as_secs_f64();
    publish_done.set(Some(publish_secs));
    show(true, &mut last_plain);
    out.event(format!(
        "publishing done in {publish_secs:.2} s; waiting for every acknowledged record to be processed (deadline {} \
         s)",
        settings.deadline.as_secs()
    ));

    // Wait until everything acknowledged is processed and both rebalances were seen.
    let deadline = Instant::now() + settings.deadline;
    let mut deadline_passed = false;
    loop {
        let missing = shared.ledger.lock().expect("ledger lock").missing();
        let rebalanced = shared.board.lock().expect("board lock").rebalanced();
        if missing == 0 && rebalanced {
            break;
        }
        if Instant::now() >= deadline {
            deadline_passed = true;
            break;
        }
        show(false, &mut last_plain);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    show(true, &mut last_plain);
    out.event("closing consumers (graceful: drain, revoke, leave) and producers");

    // Shards at the end, before the closes empty them.
    let reading_at_end: BTreeMap<usize, Vec<ShardId>> = {
        let board = shared.board.lock().expect("board lock");
        board.members.iter().map(|(&m, v)| (m, v.reading.clone())).collect()
    };
    let closes = consumers.into_iter().map(|(m, handle)| {
        let board = Arc::clone(&shared.board);
        async move {
            if let Some(v) = board.lock().expect("board lock").members.get_mut(&m) {
                v.fate = Fate::Closed;
            }
            (m, handle.close().await)
        }
    });
    for (m, result) in futures::future::join_all(closes).await {
        if let Err(e) = result {
            out.event(format!("consumer-{} closed with an error: {e}", m + 1));
        }
    }
    for producer in producers {
        let producer = Arc::into_inner(producer).context("a publishing task still holds a producer")?;
        producer.close().await.context("closing a producer")?;
    }
    if let Some(c) = coordinator {
        c.shutdown().await;
    }
    out.finish();

    let ledger = shared.ledger.lock().expect("ledger lock");
    let board = shared.board.lock().expect("board lock");
    let counts = ledger.counts();
    let members = board
        .members
        .iter()
        .map(|(&m, v)| {
            let handled = ledger.member(m);
            MemberRow {
                name: v.name.clone(),
                fate: v.fate,
                reading_at_end: if v.fate == Fate::Crashed {
                    Vec::new()
                } else {
                    reading_at_end.get(&m).cloned().unwrap_or_default()
                },
                handled: handled.handled,
                claimed: handled.claimed,
                lost: v.lost,
            }
        })
        .collect();
    let crash = board.crash.as_ref().map(|c| CrashRow {
        name: board.members[&c.member].name.clone(),
        shards: c.shards.clone(),
        first_moved: c.first_moved.map(|t| t - c.at),
        all_moved: c.all_moved.map(|t| t - c.at),
    });
    let join = board.join.as_ref().map(|j| JoinRow {
        name: board.members[&j.member].name.clone(),
        first_shard: j.first_shard.map(|(t, s)| (t - j.at, s)),
    });
    Ok(Report {
        settings: Arc::clone(&settings),
        counts,
        missing: ledger.missing(),
        unacknowledged_processed: ledger.processed_unacknowledged(),
        violations: ledger.first_violations().to_vec(),
        members,
        crash,
        join,
        publish_secs,
        process_secs: counts
            .last_new_at
            .map_or(0.0, |t| t.saturating_duration_since(publish_start).as_secs_f64()),
        total_secs: start.elapsed().as_secs_f64(),
        deadline_passed,
        coordinator: coordinator_label,
        redis: redis_label,
    })
}

/// Aborts the member reading the most shards (a crash) and starts a new one.
async fn crash_and_join(shared: &Shared, consumers: &mut BTreeMap<usize, ConsumerHandle>) -> Result<()> {
    let victim = {
        let board = shared.board.lock().expect("board lock");
        board
            .members
            .iter()
            .filter(|(_, v)| v.fate == Fate::Running)
            .max_by_key(|(&m, v)| (v.reading.len(), std::cmp::Reverse(m)))
            .map(|(&m, _)| m)
            .context("no running consumer to crash")?
    };
    let handle = consumers.remove(&victim).context("the victim's handle")?;
    let (name, shards) = {
        let mut board = shared.board.lock().expect("board lock");
        let view = board.members.get_mut(&victim).expect("a running member");
        view.fate = Fate::Crashed;
        let (name, shards) = (view.name.clone(), view.reading.clone());
        board.crash = Some(CrashWatch {
            member: victim,
            at: Instant::now(),
            shards: shards.clone(),
            first_moved: None,
            all_moved: None,
        });
        (name, shards)
    };
    handle.abort().await;
    shared.out.event(format!(
        "CRASH: {name} aborted (no drain, no leave) while reading {} shard(s) {}; they move when its member TTL ({} \
         ms) runs out",
        shards.len(),
        shard_list(&shards),
        shared.settings.timings.member_ttl_ms
    ));
    let newcomer = consumers.keys().chain([&victim]).max().map_or(0, |m| m + 1);
    shared.board.lock().expect("board lock").join = Some(JoinWatch {
        member: newcomer,
        at: Instant::now(),
        first_shard: None,
    });
    consumers.insert(newcomer, spawn_consumer(shared, newcomer)?);
    shared.out.event(format!("JOIN: consumer-{} started", newcomer + 1));
    let events = shared.board.lock().expect("board lock").check();
    for e in events {
        shared.out.event(e);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.coordinator_token.is_none() {
        let mut token = Vec::new();
        examples::deprecated_env_alias(&mut token, "COORDINATOR_TOKEN", "COORD_CLIENT_TOKEN");
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
            eprintln!("error: {}", examples::error_chain(&e));
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

    // Redis: given, or a private redis-server (killed when `_launcher` is dropped, also on Ctrl-C).
    let (redis_url, redis_label, _launcher) = match args.redis_url.as_deref().filter(|u| !u.is_empty()) {
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
        None => match RedisLauncher::start().await {
            Ok(l) => {
                let label = format!("{} (private redis-server, {})", l.url(), l.bin().display());
                (l.url(), label, Some(l))
            }
            Err(e) => {
                out.finish();
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let result = tokio::select! {
        r = run(&args, Arc::clone(&settings), redis_url, redis_label, Arc::clone(&out)) => r,
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
            eprintln!("error: {}", examples::error_chain(&e));
            ExitCode::from(2)
        }
    }
}
