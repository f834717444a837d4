//! Part B: G groups of a few members each, every group on a stream of its own. Measures what Redis executes for
//! them with no membership change: first the idle floor (members hold long leases and send nothing, so what runs
//! is the tick loop alone), then with every member heartbeating at an interval this machine can drive.
//!
//! The goal is at most 2 commands per heartbeat plus 1 per group per member TTL (10 s by default). The
//! groups are created with long timings (member TTL 1 h) so that a member driven slower than real time is not
//! expired; the per-group figure is given per default TTL (10 s), the one the goal names.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use futures::StreamExt;
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, StreamName};
use test_support::RedisServer;
use tokio::sync::Mutex;

use super::drive::{self, Driven};
use super::member::{SimMember, Target};
use super::redis_stats::{ms, percentile, Probe};
use super::report::{figure, head, note, Goal};
use super::resp_count::CountingProxy;

/// What part B runs.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Groups.
    pub groups: usize,
    /// Members per group.
    pub members: usize,
    /// Shards of each group's stream.
    pub shards: u32,
    /// Heartbeats per second to offer in the heartbeating window (sets the interval: members / rate, at least the
    /// default 2 s).
    pub rate: f64,
    /// Length of each measured window.
    pub window: Duration,
    /// Callers at once while creating, joining and converging.
    pub concurrency: usize,
    /// Most convergence passes after the join pass.
    pub converge_passes: usize,
}

/// The default member TTL the goal's "per group per TTL" refers to.
const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Runs part B against a fresh `redis-server` and in-process coordinator. The groups are created by a set-up
/// coordinator that then stops, so the measured one starts with every group there: its first safety-sweep round
/// covers them all (the steady share), and no visit of the creations is still running when the windows open.
pub async fn run(sizes: &Sizes) -> Result<()> {
    let redis = RedisServer::start().await;
    let timings = timings(sizes);
    let mut setup_config = Config::new(redis.url());
    setup_config.listen = "127.0.0.1:0".parse()?;
    let setup = CoordinatorHandle::spawn(setup_config)
        .await
        .context("set-up coordinator")?;
    let created = create_groups(&setup, sizes, timings).await;
    let drained = match &created {
        Ok(_) => {
            due_drained(
                &mut redis.connection().await,
                setup.coordinator().config().tick_interval,
            )
            .await?
        }
        Err(_) => false,
    };
    setup.shutdown().await;
    let create_elapsed = created?;
    // The coordinator reaches Redis through a counter of what it sends (Redis counts scripts' commands as its own).
    let proxy = CountingProxy::start(([127, 0, 0, 1], redis.port()).into()).await?;
    let mut config = Config::new(proxy.url());
    config.listen = "127.0.0.1:0".parse()?;
    let tick = config.tick_interval;
    let coordinator = CoordinatorHandle::spawn(config).await.context("coordinator")?;
    let setup = SetUp {
        create_elapsed,
        drained,
        timings,
    };
    let result = measure(&redis, &proxy, &coordinator, tick, sizes, &setup).await;
    coordinator.shutdown().await;
    result
}

/// What the set-up coordinator did.
struct SetUp {
    create_elapsed: Duration,
    /// Its due index had nothing due when it stopped.
    drained: bool,
    timings: GroupTimings,
}

/// The groups' timings: a member TTL of an hour, so members driven slower than real time are not expired.
fn timings(sizes: &Sizes) -> GroupTimings {
    let total = sizes.groups * sizes.members;
    let interval_ms = ((total as f64 / sizes.rate) * 1e3).max(2_000.0).round() as u64;
    GroupTimings {
        member_ttl_ms: 3_600_000,
        heartbeat_interval_ms: interval_ms,
        rebalance_timeout_ms: interval_ms.max(30_000),
        assignment_lease_ms: 1_800_000,
    }
}

/// The streams and groups of part B.
fn names(i: usize) -> Result<(StreamName, GroupName)> {
    Ok((StreamName::new(format!("scale-b{i:05}"))?, GroupName::new("g")?))
}

/// Creates every group through `coordinator`; how long it took.
async fn create_groups(coordinator: &CoordinatorHandle, sizes: &Sizes, timings: GroupTimings) -> Result<Duration> {
    let started = std::time::Instant::now();
    let names: Vec<(StreamName, GroupName)> = (0..sizes.groups).map(names).collect::<Result<_>>()?;
    let created: Vec<Result<()>> = futures::stream::iter(
        names
            .iter()
            .map(|(s, g)| crate::group::create(coordinator, s, g.as_str(), sizes.shards, Some(timings))),
    )
    .buffer_unordered(sizes.concurrency.clamp(1, 32))
    .collect()
    .await;
    created.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(started.elapsed())
}

/// Waits (up to a minute) until the due index holds nothing due, so the set-up coordinator's visits of the new
/// groups are over; whether it got there.
async fn due_drained(conn: &mut redis::aio::MultiplexedConnection, tick: Duration) -> Result<bool> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if due_now(conn).await? == 0 {
            return Ok(true);
        }
        if std::time::Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(tick).await;
    }
}

async fn measure(
    redis: &RedisServer,
    proxy: &CountingProxy,
    coordinator: &CoordinatorHandle,
    tick: Duration,
    sizes: &Sizes,
    setup: &SetUp,
) -> Result<()> {
    let (g, per) = (sizes.groups, sizes.members);
    let total = g * per;
    let interval_ms = setup.timings.heartbeat_interval_ms;
    let mut probe = Probe::new(redis.connection().await).await?;
    let load_before = drive::load_average();
    let create_elapsed = setup.create_elapsed;
    let targets: Vec<Arc<Target>> = (0..g)
        .map(|i| {
            let (stream, group) = names(i)?;
            Ok(Arc::new(Target {
                coordinator: coordinator.coordinator().clone(),
                stream,
                group,
            }))
        })
        .collect::<Result<_>>()?;
    let members: Arc<Vec<Driven>> = Arc::new(
        targets
            .iter()
            .enumerate()
            .flat_map(|(gi, t)| {
                (0..per).map(move |mi| Driven {
                    target: t.clone(),
                    member: Mutex::new(SimMember::joining(&format!("g{gi:05}m{mi:02}"))),
                })
            })
            .collect(),
    );
    let t0 = std::time::Instant::now();
    drive::progress(
        t0,
        &format!(
            "B: {g} groups created in {:.1} s; joining {total} members",
            create_elapsed.as_secs_f64()
        ),
    );
    let join = drive::pass(&members, sizes.concurrency).await;
    drive::progress(t0, &format!("B: join pass done in {:.1} s", join.elapsed.as_secs_f64()));
    // Converged: every shard read, nothing to revoke, and a whole pass that wrote no aggregate (the owners' first
    // reports of what they read are writes too).
    let mut passes = 0;
    let shards_total = g * sizes.shards as usize;
    while passes < sizes.converge_passes {
        let rev = revisions(&mut probe.conn, &targets).await?;
        drive::pass(&members, sizes.concurrency).await;
        passes += 1;
        let quiet = revisions(&mut probe.conn, &targets).await? == rev;
        drive::progress(t0, &format!("B: convergence pass {passes}, quiet {quiet}"));
        if quiet && super::one_group::state(&members, shards_total).await.1 {
            break;
        }
    }
    let (owned, settled) = super::one_group::state(&members, shards_total).await;

    // The joins made every group due once more (a commit's score); that visit is set-up, not the idle floor.
    let drained = setup.drained && due_drained(&mut probe.conn, tick).await?;
    drive::progress(t0, &format!("B: due index drained before the idle window: {drained}"));

    // The idle floor: nobody heartbeats.
    drive::progress(t0, "B: idle window");
    let (before, sent_before) = (probe.read().await?, proxy.sent());
    let stats = coordinator.coordinator().stats();
    let visits = || {
        (
            stats.tick_visits_due.load(Relaxed),
            stats.tick_visits_sweep.load(Relaxed),
        )
    };
    let visits_before = visits();
    tokio::time::sleep(sizes.window).await;
    let idle = probe.since(&before).await?;
    let idle_visits = (visits().0 - visits_before.0, visits().1 - visits_before.1);
    let idle_sent = proxy.sent().since(&sent_before);
    let idle_s = sizes.window.as_secs_f64();
    let load_idle = drive::load_average();

    // Every member at the interval.
    drive::progress(t0, "B: heartbeating window");
    let rev_before = revisions(&mut probe.conn, &targets).await?;
    let (before, sent_before) = (probe.read().await?, proxy.sent());
    let visits_busy = visits();
    let beating = drive::steady(&members, Duration::from_millis(interval_ms), sizes.window).await;
    let busy_visits = (visits().0 - visits_busy.0, visits().1 - visits_busy.1);
    let busy = probe.since(&before).await?;
    let busy_sent = proxy.sent().since(&sent_before);
    let writes = revisions(&mut probe.conn, &targets).await? - rev_before;
    let busy_s = beating.elapsed.as_secs_f64();
    let load_busy = drive::load_average();

    let hbs = beating.answered as f64 / busy_s;
    let (idle_log, busy_log) = (idle_sent.breakdown(), busy_sent.breakdown());
    let idle_sent = idle_sent.total() as f64 / idle_s;
    let idle_exec = idle.commands as f64 / idle_s;
    let busy_sent = busy_sent.total() as f64 / busy_s;
    let busy_exec = busy.commands as f64 / busy_s;
    let per_group_ttl = |per_s: f64| per_s * DEFAULT_TTL.as_secs_f64() / g as f64;
    let goal_total = 2.0 * hbs + g as f64 / DEFAULT_TTL.as_secs_f64();

    head(&format!(
        "B. {g} groups x {per} members, {} shards each, no membership change",
        sizes.shards
    ));
    let p = "B";
    figure(
        p,
        "groups created/s",
        g as f64 / create_elapsed.as_secs_f64(),
        "1/s",
        Goal::None,
    );
    figure(
        p,
        "join pass: joins/s",
        join.calls() as f64 / join.elapsed.as_secs_f64(),
        "1/s",
        Goal::None,
    );
    figure(
        p,
        "shards owned after convergence",
        owned as f64,
        "",
        Goal::AtLeast(shards_total as f64),
    );
    figure(
        p,
        "idle floor: Redis commands sent/s (tick loop only)",
        idle_sent,
        "1/s",
        Goal::None,
    );
    figure(
        p,
        "idle floor: Redis commands executed/s (scripts' included)",
        idle_exec,
        "1/s",
        Goal::None,
    );
    figure(
        p,
        "idle floor: commands sent per group per 10 s TTL",
        per_group_ttl(idle_sent),
        "",
        Goal::AtMost(1.0),
    );
    figure(
        p,
        "idle floor: commands executed per group per 10 s TTL",
        per_group_ttl(idle_exec),
        "",
        Goal::None,
    );
    figure(
        p,
        "heartbeats/s reached",
        hbs,
        "hb/s",
        Goal::AtLeast(total as f64 / (interval_ms as f64 / 1e3) * 0.95),
    );
    figure(
        p,
        "heartbeat p99",
        ms(percentile(&beating.latencies, 0.99)),
        "ms",
        Goal::None,
    );
    figure(
        p,
        "heartbeats refused or failed",
        (beating.rejected + beating.failed) as f64,
        "",
        Goal::AtMost(0.0),
    );
    figure(
        p,
        "aggregate writes while heartbeating",
        writes as f64,
        "",
        Goal::AtMost(0.0),
    );
    figure(
        p,
        "heartbeating: Redis commands sent/s",
        busy_sent,
        "1/s",
        Goal::AtMost(goal_total),
    );
    figure(
        p,
        "heartbeating: Redis commands executed/s (scripts' included)",
        busy_exec,
        "1/s",
        Goal::None,
    );
    figure(
        p,
        "commands sent per heartbeat (all / heartbeats)",
        busy_sent / hbs,
        "",
        Goal::None,
    );
    figure(
        p,
        "commands sent per heartbeat above the idle floor",
        (busy_sent - idle_sent) / hbs,
        "",
        Goal::AtMost(2.0),
    );
    figure(
        p,
        "commands executed per heartbeat above the idle floor",
        (busy_exec - idle_exec) / hbs,
        "",
        Goal::None,
    );
    note(&format!(
        "group timings: member TTL 1 h, heartbeat interval {interval_ms} ms (members / {:.0} hb/s offered, at least \
         2 s), assignment lease 30 min; coordinator tick {} ms; settled before measuring: {settled} ({passes} \
         convergence passes); windows {:.0} s each",
        sizes.rate,
        tick.as_millis(),
        sizes.window.as_secs_f64()
    ));
    note(&format!(
        "goal of the heartbeating total: 2 x {hbs:.0} hb/s + {g} groups / 10 s = {goal_total:.0} commands/s"
    ));
    note(
        "sent: counted between the coordinator and Redis (an EVALSHA is one); executed: Redis's \
          total_commands_processed (a script's redis.call's included)",
    );
    note(&format!(
        "idle window, tick visits: {} due, {} of the safety sweep",
        idle_visits.0, idle_visits.1
    ));
    note(&format!("idle window, sent: {idle_log}"));
    note(&format!("idle window, executed: {}", idle.breakdown()));
    note(&format!(
        "heartbeating window: {busy_s:.1} s; tick visits: {} due, {} of the safety sweep",
        busy_visits.0, busy_visits.1
    ));
    note(&format!("heartbeating window, sent: {busy_log}"));
    note(&format!("heartbeating window, executed: {}", busy.breakdown()));
    note(&format!(
        "load average: before {load_before}; after the idle window {load_idle}; after heartbeating {load_busy}"
    ));
    Ok(())
}

/// The sum of every group's aggregate revision.
async fn revisions(conn: &mut redis::aio::MultiplexedConnection, targets: &[Arc<Target>]) -> Result<u64> {
    let mut pipe = redis::pipe();
    for t in targets {
        pipe.hget(protocol::keys::group_metadata(&t.stream, &t.group), "revision");
    }
    let revs: Vec<Option<u64>> = pipe.query_async(conn).await?;
    Ok(revs.into_iter().flatten().sum())
}

/// Groups the due index says are due now, by Redis time.
async fn due_now(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    let now_ms = secs * 1000 + micros / 1000;
    let due: u64 = redis::cmd("ZCOUNT")
        .arg(protocol::keys::due_index())
        .arg("-inf")
        .arg(now_ms)
        .query_async(conn)
        .await?;
    Ok(due)
}
