//! The SDK runs: consumers with a no-op handler read what the raw loop read, in a group of their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use benches::settle::settled;
use coord_server::server::CoordinatorHandle;
use protocol::metadata::GroupTimings;
use protocol::names::StreamName;
use redis_link::Connection;
use stream_consumer::{Consumer, ConsumerHandle, Message};
use tokio::sync::Notify;

use crate::args::SHARDS;
use crate::backend::{Cost, Nodes};
use crate::raw::{create_redis_groups, pending_total, shard_key, total_len};
use crate::summary::RunResult;

/// Timings of the benchmark group: the defaults scaled down so joins settle quickly.
pub(crate) fn timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: 3_000,
        heartbeat_interval_ms: 300,
        rebalance_timeout_ms: 5_000,
        assignment_lease_ms: 2_400,
    }
}

pub(crate) struct SdkEnv<'a> {
    pub(crate) coordinator: &'a CoordinatorHandle,
    pub(crate) redis_url: String,
    pub(crate) stream: &'a StreamName,
    pub(crate) count: usize,
}

pub(crate) async fn sdk_run(
    env: &SdkEnv<'_>,
    con: &mut Connection,
    nodes: &mut Nodes,
    group: &str,
    members: usize,
) -> Result<RunResult> {
    let stream = env.stream;
    create_groups(env, con, group).await?;
    let handled = Arc::new(AtomicU64::new(0));
    let target = Arc::new(AtomicU64::new(u64::MAX));
    let done = Arc::new(Notify::new());
    let handles = spawn_members(
        env,
        group,
        members,
        &Handled {
            handled: handled.clone(),
            target: target.clone(),
            done: done.clone(),
        },
    )?;
    let refs: Vec<&ConsumerHandle> = handles.iter().collect();
    settled(&refs, SHARDS, Duration::from_secs(30)).await?;
    let expected = total_len(con, stream).await? + u64::from(SHARDS);
    target.store(expected, Ordering::Relaxed);
    let before = Cost::now(nodes).await?;
    let start = Instant::now();
    wake_shards(con, stream, group).await?;
    let deadline = Duration::from_secs(600);
    tokio::time::timeout(deadline, done.notified()).await.with_context(|| {
        format!(
            "not every entry handled: {} of {expected}",
            handled.load(Ordering::Relaxed)
        )
    })?;
    // The clock stops when the last acknowledgement is in.
    while pending_total(con, stream, group).await? > 0 {
        if start.elapsed() > deadline {
            bail!("entries left pending");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    let cost = Cost::now(nodes).await?.since(before);
    let seen = handled.load(Ordering::Relaxed);
    let closes: Vec<_> = handles.into_iter().map(ConsumerHandle::close).collect();
    for report in futures::future::join_all(closes).await {
        report?;
    }
    ensure!(
        seen == expected,
        "sdk: handled {seen}, expected {expected} (duplicates?)"
    );
    Ok(RunResult {
        records: seen,
        took,
        cost,
        rss_before_mib: 0.0,
        peak_rss_mib: None,
    })
}

/// What the no-op handlers count: every handled entry, and the count at which the run is done.
struct Handled {
    handled: Arc<AtomicU64>,
    target: Arc<AtomicU64>,
    done: Arc<Notify>,
}

/// Starts `members` consumers of `group` with the benchmark's timings and a counting no-op handler.
fn spawn_members(env: &SdkEnv<'_>, group: &str, members: usize, count: &Handled) -> Result<Vec<ConsumerHandle>> {
    let stream = env.stream;
    let t = timings();
    let mut handles = Vec::new();
    for m in 0..members {
        let (handled, target, done) = (count.handled.clone(), count.target.clone(), count.done.clone());
        let consumer = Consumer::builder(stream.as_str(), group)
            .coordinator(env.coordinator.url())
            .redis(env.redis_url.as_str())
            .member_id(format!("{group}-m{m}"))
            .heartbeat_interval(Duration::from_millis(t.heartbeat_interval_ms))
            .member_ttl(Duration::from_millis(t.member_ttl_ms))
            .assignment_lease(Duration::from_millis(t.assignment_lease_ms))
            .lease_safety_margin(Duration::from_millis(300))
            .request_timeout(Duration::from_secs(1))
            .read_block(Duration::from_millis(500))
            .batch_size(env.count)
            .handler(move |_msg: Message| {
                let n = handled.fetch_add(1, Ordering::Relaxed) + 1;
                if n == target.load(Ordering::Relaxed) {
                    done.notify_one();
                }
                std::future::ready(Ok::<_, std::convert::Infallible>(()))
            })
            .build()?;
        handles.push(consumer.spawn());
    }
    Ok(handles)
}

/// The group on the coordinator and, at the end of every shard, in Redis: the members join and settle without
/// reading anything.
async fn create_groups(env: &SdkEnv<'_>, con: &mut Connection, group: &str) -> Result<()> {
    let stream = env.stream;
    benches::group::create(env.coordinator, stream, group, SHARDS, Some(timings())).await?;
    // At the end of every shard: the members join and settle without reading anything.
    create_redis_groups(con, stream, group, "$").await?;
    Ok(())
}

/// Rewinds every shard's group to the start and adds one entry to each, which wakes the members' blocked reads.
async fn wake_shards(con: &Connection, stream: &StreamName, group: &str) -> Result<()> {
    // One pipeline per shard (one slot each), sent together.
    let wake = (0..SHARDS).map(|s| {
        let key = shard_key(stream, s);
        let mut pipe = redis::pipe();
        pipe.cmd("XGROUP").arg("SETID").arg(&key).arg(group).arg("0").ignore();
        pipe.cmd("XADD").arg(&key).arg("*").arg("w").arg("1").ignore();
        let mut con = con.clone();
        async move { pipe.query_async::<()>(&mut con).await }
    });
    futures::future::try_join_all(wake).await?;
    Ok(())
}
