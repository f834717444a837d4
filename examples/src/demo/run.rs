//! The run: the coordinator, the group, the consumers and producers, the crash and the join, and the wait for
//! everything acknowledged to be processed.

use super::board::{shard_list, Board, CrashWatch, Fate, JoinWatch, LostListener, MemberView};
use super::output::Output;
use super::publish::publish;
use super::report::{CrashRow, JoinRow, MemberRow, Report};
use super::settings::{Args, Settings, CONSUMERS, PRODUCERS, SHARDS};
use crate::ledger::Ledger;
use anyhow::{Context, Result};
use client_core::admin::AdminClient;
use coord_server::server::CoordinatorHandle;
use protocol::keys;
use protocol::messages::CreateGroupRequest;
use protocol::names::StreamName;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stream_consumer::{Consumer, ConsumerHandle, ConsumerStatus, Message, ShardId};
use stream_producer::Producer;
use test_support::cluster::RedisCluster;
use test_support::history::History;
use tokio::sync::watch;

/// Everything the consumers share.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) settings: Arc<Settings>,
    pub(crate) coordinator_url: String,
    pub(crate) redis_url: String,
    pub(crate) ledger: Arc<Mutex<Ledger>>,
    pub(crate) board: Arc<Mutex<Board>>,
    /// Every handling and acknowledged publish, for the checks of the summary.
    pub(crate) history: History,
    pub(crate) out: Arc<Output>,
}

pub(crate) fn spawn_consumer(shared: &Shared, member: usize) -> Result<ConsumerHandle> {
    let s = &shared.settings;
    let name = format!("consumer-{}", member + 1);
    let ms = Settings::ms;
    let ledger = Arc::clone(&shared.ledger);
    let history = shared.history.clone();
    let who = name.clone();
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
            let handling = history.begin(&who, &msg, None);
            ledger.lock().expect("ledger lock").handle(
                member,
                msg.get_str("key"),
                msg.get_str("seq"),
                msg.delivery_count(),
            );
            handling.succeeded();
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

pub(crate) async fn watch_member(
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

/// Creates the stream's group through the admin API.
pub(crate) async fn create_group(url: &str, settings: &Settings, admin_token: Option<&str>) -> Result<()> {
    let admin = AdminClient::new(url, admin_token.map(str::to_owned), Duration::from_secs(10))?;
    let body = CreateGroupRequest {
        shard_count: Some(SHARDS),
        timings: Some(settings.timings),
    };
    admin
        .create(&settings.stream, &settings.group, &body)
        .await
        .with_context(|| {
            format!(
                "creating the group (POST {}/v1/streams/{}/groups/{}) failed",
                protocol::redact::redact_url(url),
                settings.stream,
                settings.group
            )
        })?;
    Ok(())
}

/// The whole run: coordinator and group, consumers, producers publishing (with the slot migration, the crash and
/// the join), the wait until everything acknowledged is processed, the closes, and the report.
pub(crate) async fn run(
    args: &Args,
    settings: Arc<Settings>,
    redis_url: String,
    redis_label: String,
    cluster: Option<&RedisCluster>,
    out: Arc<Output>,
) -> Result<Report> {
    let start = out.start;
    let (coordinator_url, coordinator, coordinator_label) = start_coordinator(args, &settings, &redis_url).await?;
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
        history: History::new(),
        out: Arc::clone(&out),
    };
    let stream = StreamName::new(settings.stream.as_str()).context("the demo's stream name")?;
    if let Some(cluster) = cluster {
        print_spread(&out, cluster, &stream).await?;
    }
    let mut consumers: BTreeMap<usize, ConsumerHandle> = BTreeMap::new();
    for m in 0..CONSUMERS {
        consumers.insert(m, spawn_consumer(&shared, m)?);
    }
    out.event(format!("{CONSUMERS} consumers started (consumer-1..{CONSUMERS})"));

    let producers = start_producers(&settings, &coordinator_url, &redis_url).await?;
    let mut progress = Progress::new(&shared);
    let slot_migrations = progress
        .publish(&producers, &mut consumers, cluster.map(|c| (c, &stream)))
        .await?;
    let publish_secs = progress.publish_secs();
    let deadline_passed = progress.wait_processed().await;
    out.event("closing consumers (graceful: drain, revoke, leave) and producers");
    let reading_at_end = close_all(&shared, consumers, producers).await?;
    if let Some(c) = coordinator {
        c.shutdown().await;
    }
    out.finish();

    let ledger = shared.ledger.lock().expect("ledger lock");
    let board = shared.board.lock().expect("board lock");
    let counts = ledger.counts();
    let (members, crash, join) = rows(&ledger, &board, &reading_at_end);
    Ok(Report {
        settings: Arc::clone(&settings),
        counts,
        checks: shared.history.check(),
        unacknowledged_processed: ledger.processed_unacknowledged(),
        members,
        crash,
        join,
        publish_secs,
        process_secs: counts.last_new_at.map_or(0.0, |t| {
            t.saturating_duration_since(progress.publish_start).as_secs_f64()
        }),
        total_secs: start.elapsed().as_secs_f64(),
        deadline_passed,
        coordinator: coordinator_label,
        redis: redis_label,
        slot_migrations,
    })
}

/// The coordinator: the one `--coordinator-url` names, or one in this process on the demo's Redis. Answers its
/// URL, the handle of an in-process one, and the label of the summary.
async fn start_coordinator(
    args: &Args,
    settings: &Settings,
    redis_url: &str,
) -> Result<(String, Option<CoordinatorHandle>, String)> {
    Ok(match args.coordinator_url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) => {
            let url = url.trim_end_matches('/').to_owned();
            (
                url.clone(),
                None,
                format!("{} (external)", protocol::redact::redact_url(&url)),
            )
        }
        None => {
            let mut config = coord_server::Config::new(redis_url.to_owned());
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
    })
}

/// The demo's producers, each ready (its routing fetched).
async fn start_producers(settings: &Settings, coordinator_url: &str, redis_url: &str) -> Result<Vec<Arc<Producer>>> {
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let mut builder = Producer::builder(settings.stream.as_str())
            .coordinator(coordinator_url)
            .redis(redis_url);
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
    Ok(producers)
}

/// The status line and the plain progress lines, from publishing until everything is processed.
struct Progress<'a> {
    shared: &'a Shared,
    /// Records the producers attempted so far.
    attempted: Arc<AtomicU64>,
    publish_start: Instant,
    /// When publishing ended (seconds after `publish_start`): the published rate stops there.
    publish_done: Option<f64>,
    /// When the last plain progress line was printed (one a second; a terminal also gets the live status).
    last_plain: Instant,
}

impl<'a> Progress<'a> {
    fn new(shared: &'a Shared) -> Self {
        Progress {
            shared,
            attempted: Arc::new(AtomicU64::new(0)),
            publish_start: Instant::now(),
            publish_done: None,
            last_plain: Instant::now(),
        }
    }

    /// Shows the progress; a plain line when `force_plain` or a second after the last one.
    fn show(&mut self, force_plain: bool) {
        let shared = self.shared;
        let processed = shared.ledger.lock().expect("ledger lock").counts().distinct;
        let line = shared.board.lock().expect("board lock").line();
        let plain = force_plain || self.last_plain.elapsed() >= Duration::from_secs(1);
        if plain {
            self.last_plain = Instant::now();
        }
        let secs = self.publish_start.elapsed().as_secs_f64();
        let published = (
            self.attempted.load(Ordering::Relaxed),
            self.publish_done.unwrap_or(secs),
        );
        shared.out.status(published, (processed, secs), &line, plain);
    }

    /// How long publishing took (after [`publish`](Self::publish)).
    fn publish_secs(&self) -> f64 {
        self.publish_done.unwrap_or_default()
    }

    /// Publishes every record, with the crash and the join halfway and, on a cluster, a slot migration a quarter
    /// of the way through, while everything runs. Answers the slot migrations (`None` on one server).
    async fn publish(
        &mut self,
        producers: &[Arc<Producer>],
        consumers: &mut BTreeMap<usize, ConsumerHandle>,
        cluster: Option<(&RedisCluster, &StreamName)>,
    ) -> Result<Option<Vec<String>>> {
        let (shared, settings) = (self.shared, &self.shared.settings);
        shared.out.event(format!(
            "{PRODUCERS} producers publishing {} records at {}",
            settings.records,
            if settings.rate == 0 {
                "full speed".to_owned()
            } else {
                format!("{} records/s", settings.rate)
            }
        ));
        self.publish_start = Instant::now();
        let mut publishers: Vec<_> = producers
            .iter()
            .enumerate()
            .map(|(p, producer)| {
                tokio::spawn(publish(
                    p,
                    Arc::clone(producer),
                    Arc::clone(settings),
                    Arc::clone(&shared.ledger),
                    shared.history.clone(),
                    Arc::clone(&self.attempted),
                ))
            })
            .collect();
        let mut crashed = false;
        let mut migrated = cluster.is_none();
        let mut slot_migrations = cluster.map(|_| Vec::new());
        loop {
            let done = publishers.iter().all(|p| p.is_finished());
            let attempted = self.attempted.load(Ordering::Relaxed);
            if let Some((cluster, stream)) = cluster.filter(|_| !migrated) {
                if done || attempted >= settings.records / 4 {
                    migrated = true;
                    self.show(true);
                    let moved = migrate_one_shard(&shared.out, cluster, stream).await?;
                    slot_migrations.get_or_insert_with(Vec::new).push(moved);
                }
            }
            if !crashed && (done || self.attempted.load(Ordering::Relaxed) >= settings.records / 2) {
                crashed = true;
                self.show(true);
                crash_and_join(shared, consumers).await?;
            }
            if done {
                break;
            }
            self.show(false);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for p in publishers.drain(..) {
            p.await.context("a publishing task failed")??;
        }
        let publish_secs = self.publish_start.elapsed().as_secs_f64();
        self.publish_done = Some(publish_secs);
        self.show(true);
        shared.out.event(format!(
            "publishing done in {publish_secs:.2} s; waiting for every acknowledged record to be processed \
             (deadline {} s)",
            settings.deadline.as_secs()
        ));
        Ok(slot_migrations)
    }

    /// Waits until everything acknowledged is processed and both rebalances were seen; answers whether the
    /// deadline passed first.
    async fn wait_processed(&mut self) -> bool {
        let deadline = Instant::now() + self.shared.settings.deadline;
        let mut deadline_passed = false;
        loop {
            let missing = self.shared.ledger.lock().expect("ledger lock").missing();
            let rebalanced = self.shared.board.lock().expect("board lock").rebalanced();
            if missing == 0 && rebalanced {
                break;
            }
            if Instant::now() >= deadline {
                deadline_passed = true;
                break;
            }
            self.show(false);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.show(true);
        deadline_passed
    }
}

/// Closes every consumer (gracefully: drain, revoke, leave) and producer; answers the shards each member read
/// just before (the closes empty them).
async fn close_all(
    shared: &Shared,
    consumers: BTreeMap<usize, ConsumerHandle>,
    producers: Vec<Arc<Producer>>,
) -> Result<BTreeMap<usize, Vec<ShardId>>> {
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
            shared
                .out
                .event(format!("consumer-{} closed with an error: {e}", m + 1));
        }
    }
    for producer in producers {
        let producer = Arc::into_inner(producer).context("a publishing task still holds a producer")?;
        producer.close().await.context("closing a producer")?;
    }
    Ok(reading_at_end)
}

/// The summary's rows: every member, the crash and the join.
fn rows(
    ledger: &Ledger,
    board: &Board,
    reading_at_end: &BTreeMap<usize, Vec<ShardId>>,
) -> (Vec<MemberRow>, Option<CrashRow>, Option<JoinRow>) {
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
    (members, crash, join)
}

/// Prints which master serves each shard's slot; answers the shards of each node (by index).
async fn print_spread(out: &Output, cluster: &RedisCluster, stream: &StreamName) -> Result<Vec<Vec<ShardId>>> {
    let mut by_node: Vec<Vec<ShardId>> = vec![Vec::new(); cluster.nodes().len()];
    for s in 0..SHARDS {
        let owner = cluster.owner_of_slot(keys::shard_slot(stream, ShardId(s))).await;
        by_node[owner].push(ShardId(s));
    }
    let spread: Vec<String> = by_node
        .iter()
        .enumerate()
        .map(|(node, shards)| {
            let list: Vec<String> = shards
                .iter()
                .map(|&s| format!("{} (slot {})", s.0, keys::shard_slot(stream, s)))
                .collect();
            format!(
                "master 127.0.0.1:{}: {} shard(s) {}",
                cluster.nodes()[node].port(),
                shards.len(),
                if list.is_empty() {
                    "-".to_owned()
                } else {
                    list.join(", ")
                }
            )
        })
        .collect();
    out.event(format!("shards on the cluster's masters: {}", spread.join("; ")));
    Ok(by_node)
}

/// Moves the slot of one shard of the master with the most shards, live, to the master with the fewest (as an
/// operator rebalancing a cluster would), and says so; producers and consumers follow `ASK` and `MOVED`. Answers
/// the move in one line for the summary.
async fn migrate_one_shard(out: &Output, cluster: &RedisCluster, stream: &StreamName) -> Result<String> {
    let by_node = print_spread(out, cluster, stream).await?;
    let (from, _) = by_node
        .iter()
        .enumerate()
        .max_by_key(|(node, shards)| (shards.len(), std::cmp::Reverse(*node)))
        .context("the cluster has no node")?;
    let (to, _) = by_node
        .iter()
        .enumerate()
        .filter(|(node, _)| *node != from)
        .min_by_key(|(node, shards)| (shards.len(), *node))
        .context("the cluster has one node only")?;
    let shard = *by_node[from].last().context("no shard on the fullest master")?;
    let slot = keys::shard_slot(stream, shard);
    let port = |node: usize| cluster.nodes()[node].port();
    out.event(format!(
        "slot migration: moving slot {slot} (shard {}) live from master 127.0.0.1:{} to master 127.0.0.1:{}, while \
         producers and consumers run (they follow ASK, then MOVED)",
        shard.0,
        port(from),
        port(to)
    ));
    let started = Instant::now();
    let moved_from = cluster.owner_of_slot(slot).await;
    let keys_moved = cluster.migrate_slot(slot, to).await;
    let took = started.elapsed();
    out.event(format!(
        "slot migration: slot {slot} (shard {}) moved from master 127.0.0.1:{} to master 127.0.0.1:{}, {} key(s) in \
         {} ms",
        shard.0,
        port(moved_from),
        port(to),
        keys_moved,
        took.as_millis()
    ));
    print_spread(out, cluster, stream).await?;
    Ok(format!(
        "slot {slot} (shard {}): :{} -> :{}, {} key(s), {} ms",
        shard.0,
        port(moved_from),
        port(to),
        keys_moved,
        took.as_millis()
    ))
}

/// Aborts the member reading the most shards (a crash) and starts a new one.
pub(crate) async fn crash_and_join(shared: &Shared, consumers: &mut BTreeMap<usize, ConsumerHandle>) -> Result<()> {
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
