//! Part A: one group of M members x S shards. Joins every member, converges, then measures the no-change
//! heartbeat latency at the group's heartbeat interval, the membership changes per second a loop of leaves and
//! joins commits, the bytes Redis receives per change, and the size of the group's metadata hash.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, StreamName};
use test_support::RedisServer;
use tokio::sync::Mutex;

use super::drive::{self, Driven};
use super::member::{SimMember, Target};
use super::redis_stats::{self, ms, percentile, Probe};
use super::report::{figure, head, note, Goal};

/// What part A runs.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Members of the group.
    pub members: usize,
    /// Shards of its stream.
    pub shards: u32,
    /// Callers at once while joining and converging.
    pub concurrency: usize,
    /// Most convergence passes after the join pass.
    pub converge_passes: usize,
    /// Length of the steady heartbeat window.
    pub heartbeat_window: Duration,
    /// Length of the leave/join window.
    pub change_window: Duration,
    /// Members leaving and joining again at once during the change window.
    pub churners: usize,
}

/// Issue 7's heartbeat goal, kept for the large group.
const HEARTBEAT_P99_MS: f64 = 5.0;

/// Runs part A against a fresh `redis-server` and in-process coordinator.
pub async fn run(sizes: &Sizes) -> Result<()> {
    let redis = RedisServer::start().await;
    let mut config = Config::new(redis.url());
    config.listen = "127.0.0.1:0".parse()?;
    let coordinator = CoordinatorHandle::spawn(config).await.context("coordinator")?;
    let stream = StreamName::new("scale-a")?;
    let group = GroupName::new("g")?;
    let timings = GroupTimings::default();
    crate::group::create(&coordinator, &stream, group.as_str(), sizes.shards, Some(timings)).await?;
    let result = measure(&redis, &coordinator, &stream, &group, timings, sizes).await;
    coordinator.shutdown().await;
    result
}

async fn measure(
    redis: &RedisServer,
    coordinator: &CoordinatorHandle,
    stream: &StreamName,
    group: &GroupName,
    timings: GroupTimings,
    sizes: &Sizes,
) -> Result<()> {
    let (m, s) = (sizes.members, sizes.shards);
    let mut probe = Probe::new(redis.connection().await).await?;
    let ping = redis::cmd("PING");
    let (ping_p50, ping_p99) = redis_stats::round_trip_ms(&mut probe.conn, &ping, 2_000).await;
    let evalsha = redis_stats::evalsha_cmd(&mut probe.conn).await;
    let (eval_p50, eval_p99) = redis_stats::round_trip_ms(&mut probe.conn, &evalsha, 2_000).await;

    let target = Arc::new(Target {
        coordinator: coordinator.coordinator().clone(),
        stream: stream.clone(),
        group: group.clone(),
    });
    let members: Arc<Vec<Driven>> = Arc::new(
        (0..m)
            .map(|i| Driven {
                target: target.clone(),
                member: Mutex::new(SimMember::joining(&format!("m{i:05}"))),
            })
            .collect(),
    );
    let load_before = drive::load_average();
    let t0 = Instant::now();
    let interval = Duration::from_millis(timings.heartbeat_interval_ms);
    drive::progress(t0, &format!("A: joining {m} members"));
    let keeper = drive::KeepAlive::start(&members, interval, 16);
    let join = drive::pass(&members, sizes.concurrency).await;
    drive::progress(t0, &format!("A: join pass done in {:.1} s", join.elapsed.as_secs_f64()));
    // Converged: every shard read, nothing to revoke, and a whole pass that wrote no aggregate (the owners'
    // first reports of what they read are writes too).
    let key = protocol::keys::group_metadata(stream, group);
    let mut converge_time = Duration::ZERO;
    let mut passes = 0;
    let mut settled = false;
    while passes < sizes.converge_passes {
        let rev = revision(&mut probe.conn, &key).await;
        let t = drive::pass(&members, sizes.concurrency).await;
        converge_time += t.elapsed;
        passes += 1;
        let quiet = revision(&mut probe.conn, &key).await == rev;
        let (o, ok) = state(&members, s as usize).await;
        settled = quiet && ok;
        drive::progress(
            t0,
            &format!("A: convergence pass {passes}: {o} shards owned, quiet {quiet}"),
        );
        if settled {
            break;
        }
    }
    let kept = keeper.stop().await;
    let (owned, _) = state(&members, s as usize).await;

    // Steady state: every member at the group's interval, no membership change expected.
    let rev_before = revision(&mut probe.conn, &key).await;
    let before = probe.read().await?;
    drive::progress(t0, "A: heartbeat window");
    let steady = drive::steady(&members, interval, sizes.heartbeat_window).await;
    let steady_delta = probe.since(&before).await?;
    let rev_after = revision(&mut probe.conn, &key).await;
    let load_steady = drive::load_average();

    // Changes: leaves and joins only (the other members are silent, well within their TTL), so what Redis receives
    // is what the changes cost (plus the tick loop's one group every tick).
    let window = sizes
        .change_window
        .min(Duration::from_millis(timings.member_ttl_ms / 2));
    let changes = Arc::new(AtomicU64::new(0));
    drive::progress(t0, "A: change window");
    let rev0 = revision(&mut probe.conn, &key).await;
    let before = probe.read().await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..sizes.churners.max(1) {
        let (members, changes) = (members.clone(), changes.clone());
        let churners = sizes.churners.max(1);
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            while started.elapsed() < window {
                let d = &members[i % members.len()];
                let mut mem = d.member.lock().await;
                if d.target.leave(&mut mem).await {
                    changes.fetch_add(1, Ordering::Relaxed);
                }
                let (beat, _) = d.target.beat(&mut mem).await;
                if beat == super::member::Beat::Answered {
                    changes.fetch_add(1, Ordering::Relaxed);
                }
                i += churners;
            }
        }));
    }
    for t in tasks {
        t.await.expect("churner");
    }
    let change_elapsed = started.elapsed();
    let change_delta = probe.since(&before).await?;
    let commits = revision(&mut probe.conn, &key).await - rev0;
    let changes = changes.load(Ordering::Relaxed);
    let (memory, hlen, longest, longest_len) = redis_stats::hash_size(&mut probe.conn, &key).await?;
    let liveness_len: u64 = redis::cmd("HLEN")
        .arg(protocol::keys::group_liveness(stream, group))
        .query_async(&mut probe.conn)
        .await?;
    let load_after = drive::load_average();

    let beats = steady.answered as f64;
    let offered = m as f64 / interval.as_secs_f64();
    let rate = steady.calls() as f64 / steady.elapsed.as_secs_f64();
    head(&format!("A. one group: {m} members x {s} shards (default timings)"));
    let p = "A";
    figure(p, "raw Redis PING round trip p50", ping_p50, "ms", Goal::None);
    figure(p, "raw Redis PING round trip p99", ping_p99, "ms", Goal::None);
    figure(p, "raw Redis EVALSHA (TIME) round trip p50", eval_p50, "ms", Goal::None);
    figure(p, "raw Redis EVALSHA (TIME) round trip p99", eval_p99, "ms", Goal::None);
    figure(
        p,
        "join pass: joins/s",
        join.calls() as f64 / join.elapsed.as_secs_f64(),
        "1/s",
        Goal::None,
    );
    figure(p, "join pass: wall time", join.elapsed.as_secs_f64(), "s", Goal::None);
    figure(
        p,
        "join p99 latency",
        ms(percentile(&join.latencies, 0.99)),
        "ms",
        Goal::None,
    );
    figure(
        p,
        "convergence passes after the join (the last wrote nothing)",
        passes as f64,
        "",
        Goal::None,
    );
    figure(p, "convergence wall time", converge_time.as_secs_f64(), "s", Goal::None);
    figure(
        p,
        "keep-alive heartbeats during join and convergence",
        kept as f64,
        "",
        Goal::None,
    );
    figure(
        p,
        "shards owned after convergence",
        owned as f64,
        "",
        Goal::AtLeast(f64::from(s)),
    );
    figure(
        p,
        "heartbeat rate reached (offered: members / interval; 95 % of it is the pass, as in B)",
        rate,
        "hb/s",
        Goal::AtLeast(offered * 0.95),
    );
    figure(
        p,
        "heartbeat p50",
        ms(percentile(&steady.latencies, 0.5)),
        "ms",
        Goal::None,
    );
    figure(
        p,
        "heartbeat p99",
        ms(percentile(&steady.latencies, 0.99)),
        "ms",
        Goal::AtMost(HEARTBEAT_P99_MS),
    );
    figure(
        p,
        "heartbeat max",
        ms(percentile(&steady.latencies, 1.0)),
        "ms",
        Goal::None,
    );
    figure(
        p,
        "heartbeats refused or failed",
        (steady.rejected + steady.failed) as f64,
        "",
        Goal::AtMost(0.0),
    );
    figure(
        p,
        "aggregate writes in the heartbeat window",
        (rev_after - rev_before) as f64,
        "",
        Goal::AtMost(0.0),
    );
    figure(
        p,
        "Redis script calls (EVALSHA) per heartbeat",
        steady_delta.script_calls() as f64 / beats,
        "",
        Goal::None,
    );
    figure(
        p,
        "Redis commands executed per heartbeat (scripts' included)",
        steady_delta.commands as f64 / beats,
        "",
        Goal::None,
    );
    figure(
        p,
        "Redis bytes received per heartbeat",
        steady_delta.input_bytes as f64 / beats,
        "B",
        Goal::None,
    );
    let cps = changes as f64 / change_elapsed.as_secs_f64();
    figure(
        p,
        "membership changes/s (leaves + joins answered)",
        cps,
        "1/s",
        Goal::None,
    );
    figure(
        p,
        "aggregate commits/s in the change window",
        commits as f64 / change_elapsed.as_secs_f64(),
        "1/s",
        Goal::None,
    );
    figure(
        p,
        "Redis bytes received per change",
        change_delta.input_bytes as f64 / changes.max(1) as f64,
        "B",
        Goal::None,
    );
    figure(
        p,
        "Redis bytes received per aggregate commit",
        change_delta.input_bytes as f64 / commits.max(1) as f64,
        "B",
        Goal::None,
    );
    figure(p, "metadata hash MEMORY USAGE", memory as f64, "B", Goal::None);
    figure(p, "metadata hash HLEN", hlen as f64, "", Goal::None);
    figure(
        p,
        &format!("metadata hash largest field ({longest}) HSTRLEN"),
        longest_len as f64,
        "B",
        Goal::None,
    );
    figure(p, "liveness hash HLEN", liveness_len as f64, "", Goal::None);
    note(&format!(
        "heartbeats are in-process calls of Coordinator::heartbeat (HTTP excluded), timed by the caller: the \
         span redis_stream_coord_heartbeat_duration_seconds measures behind HTTP; window {:.1} s, {} calls, \
         settled before it: {settled}",
        steady.elapsed.as_secs_f64(),
        steady.calls()
    ));
    note(&format!(
        "changes: {} churners, each a leave then a join of the next member of its slice, {:.1} s, {changes} \
         changes, {commits} commits; the other members silent; the tick loop (250 ms) runs throughout",
        sizes.churners,
        change_elapsed.as_secs_f64()
    ));
    note(&format!(
        "commands in the heartbeat window: {}",
        steady_delta.breakdown()
    ));
    note(&format!("commands in the change window: {}", change_delta.breakdown()));
    note(&format!(
        "load average: before join {load_before}; after heartbeats {load_steady}; at the end {load_after}"
    ));
    Ok(())
}

/// Shards owned over all members, and whether the group is settled (every member in, nothing left to revoke,
/// every shard read).
pub(super) async fn state(members: &[Driven], shards: usize) -> (usize, bool) {
    let mut owned = 0;
    let mut settled = true;
    for d in members {
        let m = d.member.lock().await;
        owned += m.owned();
        settled &= m.is_member() && m.req.revoking.is_empty();
    }
    (owned, settled && owned == shards)
}

/// The group's aggregate revision.
async fn revision(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    let r: Option<u64> = redis::cmd("HGET")
        .arg(key)
        .arg("revision")
        .query_async(conn)
        .await
        .unwrap_or(None);
    r.unwrap_or(0)
}
