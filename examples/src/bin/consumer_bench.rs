//! Consumer benchmark (issue 7, item 1): the consumer SDK against a hand-written raw loop, over the same records,
//! in the same run, against one private `redis-server` (started through `examples::redis_launcher`) and an
//! in-process coordinator.
//!
//! ```text
//! cargo run --release -p examples --bin consumer_bench -- --records 400000 --payload-bytes 100
//! ```
//!
//! 1. `--records` entries (one field `p` of `--payload-bytes` bytes) are appended round-robin to the 8 shard
//!    streams (`protocol::keys::shard_stream`) with pipelined `XADD`s, once, before anything is measured.
//! 2. Every measured run reads *all* entries of the 8 shards through a Redis consumer group of its own (so every
//!    run reads the same records), and acknowledges every one of them:
//!    * raw: one task and one connection per shard; each round trip is one pipeline `XACK <the previous batch's
//!      ids>` + `XREADGROUP COUNT <count> STREAMS <shard> >`, until the shard is empty, then a last `XACK`. The
//!      reply is walked (ids kept, fields looked at) but not copied.
//!    * sdk-N: N `stream_consumer` members (batch size `<count>`, no-op handler that counts). The members join
//!      and settle (every shard read, none pending or revoking) while the Redis groups stand at the end of the
//!      streams (`XGROUP CREATE ... $`); then the clock starts, every group is moved to the beginning (`XGROUP
//!      SETID ... 0`) and one wake-up entry is appended per shard (the readers are blocked in `XREADGROUP`), so
//!      the run reads every record plus those 8. The clock stops when the handler has seen them all and no
//!      entry is pending (`XPENDING`), i.e. when the last `XACK` is in.
//! 3. Each mode runs `--rounds` times, interleaved (raw, sdk-1, sdk-4, raw, ...); the median rate of each mode
//!    is reported with its min and max, the ratio to the raw loop's median (goal, issue 17: >= 0.90) and the
//!    medians of client and Redis CPU per record (goal: the SDK's client CPU within 1.15x of the raw loop's;
//!    client CPU is this process's threads' time on a CPU in nanoseconds, `examples::cpu`, Redis's from `INFO`).
//!    The raw loop runs over every connection of `--raw-links` (redis-rs's multiplexed connection and parser;
//!    `redis_link::PipelinedConnection` with its own parser, about half the client CPU): the rate ratio is to
//!    the best median rate among them, the CPU ratio to the lowest client CPU among them. Memory: this
//!    process's `VmRSS` before each run and its peak during it (`VmHWM`, reset through `/proc/self/clear_refs`),
//!    of round 1 (the process also holds the coordinator and the members of the other modes' groups).
//!
//! `--cluster`: the same against a private local 3-master Redis Cluster (`examples::cluster_launcher`); the raw
//! loop's shard tasks then each use a redis-rs cluster connection (the strongest raw cluster client: it routes
//! every pipeline to the shard's master), the SDK gets the `cluster:` target, Redis CPU and command counts are
//! summed over the masters. On 2 cores the three masters share the cores with the client: the run shows what the
//! cluster paths cost, not node scaling.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use coord_server::server::CoordinatorHandle;
use examples::cluster_launcher::ClusterLauncher;
use examples::redis_launcher::RedisLauncher;
use protocol::keys;
use protocol::messages::CreateGroupRequest;
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, StreamName};
use protocol::ShardId;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::Value;
use redis_link::Connection;
use stream_consumer::{Consumer, ConsumerHandle, Message};
use tokio::sync::Notify;

/// Shards of the benchmark stream.
const SHARDS: u32 = 8;

#[derive(Parser, Debug)]
#[command(about = "Raw XREADGROUP + pipelined XACK loop vs the consumer SDK, same records, same run")]
struct Args {
    /// Records pre-loaded into the 8 shards.
    #[arg(long, default_value_t = 400_000)]
    records: usize,
    /// Payload size of every record, in bytes.
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// Entries per read (`XREADGROUP COUNT`; the SDK's batch size), the same for both.
    #[arg(long, default_value_t = stream_consumer::DEFAULT_BATCH_SIZE)]
    count: usize,
    /// SDK member counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    members: Vec<usize>,
    /// Rounds of every mode, interleaved (the median of each is reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Skip the raw loop (for profiling the SDK alone; no ratios then).
    #[arg(long)]
    no_raw: bool,
    /// Connections of the raw loop to try, comma-separated: `multiplexed` (redis-rs's multiplexed connection and
    /// reply parser) and `pipelined` (`redis_link::PipelinedConnection`, the SDK's own reader connection and
    /// parser). Every one runs in every round; the best median is the baseline of the ratios. One server only
    /// (a cluster's raw loop uses redis-rs cluster connections).
    #[arg(long, value_delimiter = ',', default_value = "multiplexed,pipelined")]
    raw_links: Vec<RawLink>,
    /// Skip the SDK runs (for profiling the raw loop alone).
    #[arg(long)]
    no_sdk: bool,
    /// Run on a private local 3-master Redis Cluster instead of one redis-server.
    #[arg(long)]
    cluster: bool,
}

/// The connection a raw shard task reads through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RawLink {
    /// redis-rs's multiplexed connection (and its reply parser).
    Multiplexed,
    /// `redis_link::PipelinedConnection` (the parser the SDK's readers use).
    Pipelined,
}

impl RawLink {
    fn label(self) -> &'static str {
        match self {
            RawLink::Multiplexed => "redis-rs multiplexed",
            RawLink::Pipelined => "redis_link pipelined",
        }
    }
}

/// The private Redis of the run: one server or a local cluster.
enum Backend {
    Single(RedisLauncher),
    Cluster(ClusterLauncher),
}

impl Backend {
    async fn start(cluster: bool) -> Result<Backend> {
        let launched = if cluster {
            ClusterLauncher::start().await.map(Backend::Cluster)
        } else {
            RedisLauncher::start().await.map(Backend::Single)
        };
        launched.map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// What the coordinator and the SDK are given.
    fn target(&self) -> String {
        match self {
            Backend::Single(r) => r.url(),
            Backend::Cluster(c) => c.target(),
        }
    }

    /// Every server (every master of a cluster), for the CPU and command counts.
    fn node_urls(&self) -> Vec<String> {
        match self {
            Backend::Single(r) => vec![r.url()],
            Backend::Cluster(c) => c.nodes().iter().map(RedisLauncher::url).collect(),
        }
    }

    /// A connection for commands of one shard each (a cluster connection on a cluster).
    async fn connection(&self) -> Result<Connection> {
        Ok(match self {
            Backend::Single(r) => Connection::Single(redis::Client::open(r.url())?.get_connection_manager().await?),
            Backend::Cluster(c) => {
                let seeds: Vec<String> = c.nodes().iter().map(RedisLauncher::url).collect();
                Connection::cluster(&seeds, Duration::from_secs(2), Duration::from_secs(10)).await?
            }
        })
    }
}

/// A connection to every server, for [`Cost::now`].
struct Nodes(Vec<MultiplexedConnection>);

impl Nodes {
    async fn open(backend: &Backend) -> Result<Nodes> {
        let mut cons = Vec::new();
        for url in backend.node_urls() {
            cons.push(redis::Client::open(url)?.get_multiplexed_async_connection().await?);
        }
        Ok(Nodes(cons))
    }
}

/// CPU and Redis work spent so far: this process's CPU time, `redis-server`'s CPU time, and the calls of the
/// commands a reader sends (`INFO cpu`, `INFO commandstats`).
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    client_cpu_s: f64,
    redis_cpu_s: f64,
    xreadgroup_calls: u64,
    xack_calls: u64,
}

impl Cost {
    /// The cost so far, Redis's summed over every server.
    async fn now(nodes: &mut Nodes) -> Result<Cost> {
        let mut total = Cost {
            client_cpu_s: examples::cpu::process_cpu_seconds(),
            ..Cost::default()
        };
        for con in &mut nodes.0 {
            let one = Self::of_server(con).await?;
            total.redis_cpu_s += one.redis_cpu_s;
            total.xreadgroup_calls += one.xreadgroup_calls;
            total.xack_calls += one.xack_calls;
        }
        Ok(total)
    }

    async fn of_server(con: &mut MultiplexedConnection) -> Result<Cost> {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(con)
            .await?;
        let field = |name: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let calls = |cmd: &str| -> u64 {
            info.lines()
                .find_map(|l| {
                    let rest = l.strip_prefix("cmdstat_")?.strip_prefix(cmd)?.strip_prefix(":calls=")?;
                    rest.split(',').next()?.parse().ok()
                })
                .unwrap_or(0)
        };
        Ok(Cost {
            client_cpu_s: examples::cpu::process_cpu_seconds(),
            redis_cpu_s: field("used_cpu_sys") + field("used_cpu_user"),
            xreadgroup_calls: calls("xreadgroup"),
            xack_calls: calls("xack"),
        })
    }

    fn since(self, before: Cost) -> Cost {
        Cost {
            client_cpu_s: self.client_cpu_s - before.client_cpu_s,
            redis_cpu_s: self.redis_cpu_s - before.redis_cpu_s,
            xreadgroup_calls: self.xreadgroup_calls - before.xreadgroup_calls,
            xack_calls: self.xack_calls - before.xack_calls,
        }
    }

    /// `client µs, redis µs, XREADGROUP, XACK` per record.
    fn per_record(&self, n: u64) -> String {
        let n = n.max(1) as f64;
        format!(
            "cpu/record: client {:.2} us, redis {:.2} us; per 1000 records: {:.1} XREADGROUP, {:.1} XACK",
            self.client_cpu_s * 1e6 / n,
            self.redis_cpu_s * 1e6 / n,
            self.xreadgroup_calls as f64 * 1000.0 / n,
            self.xack_calls as f64 * 1000.0 / n
        )
    }
}

/// One measured run.
struct RunResult {
    records: u64,
    took: Duration,
    cost: Cost,
    /// This process's resident set before the run and its peak during it (`VmHWM`, reset before the run), in
    /// MiB; set by [`measured`].
    rss_before_mib: f64,
    peak_rss_mib: Option<f64>,
}

/// Runs one mode with this process's memory measured around it (the peak only where the kernel lets
/// `/proc/self/clear_refs` reset it).
async fn measured(run: impl std::future::Future<Output = Result<RunResult>>) -> Result<RunResult> {
    let rss_before = examples::mem::status_mib("VmRSS").unwrap_or(0.0);
    let resettable = examples::mem::reset_peak_rss();
    let mut result = run.await?;
    result.rss_before_mib = rss_before;
    result.peak_rss_mib = if resettable {
        examples::mem::status_mib("VmHWM")
    } else {
        None
    };
    Ok(result)
}

impl RunResult {
    /// `rss <before> -> peak <peak> MiB`.
    fn memory(&self) -> String {
        match self.peak_rss_mib {
            Some(peak) => format!("rss {:.0} -> peak {peak:.0} MiB", self.rss_before_mib),
            None => format!("rss {:.0} MiB before", self.rss_before_mib),
        }
    }
}

fn shard_key(stream: &StreamName, shard: u32) -> String {
    keys::shard_stream(stream, ShardId(shard))
}

/// Appends `records` entries round-robin over the shards: one task per shard, pipelines of 256 (one shard per
/// pipeline, so it also runs on a cluster).
async fn preload(backend: &Backend, stream: &StreamName, records: usize, payload: &[u8]) -> Result<()> {
    let payload: Arc<Vec<u8>> = Arc::new(payload.to_vec());
    let mut tasks = Vec::new();
    for shard in 0..SHARDS {
        let mut con = backend.connection().await?;
        let key = shard_key(stream, shard);
        let payload = payload.clone();
        let mine = (records + (SHARDS - 1 - shard) as usize) / SHARDS as usize;
        tasks.push(tokio::spawn(async move {
            let mut left = mine;
            while left > 0 {
                let n = left.min(256);
                let mut pipe = redis::pipe();
                for _ in 0..n {
                    pipe.cmd("XADD")
                        .arg(&key)
                        .arg("*")
                        .arg("p")
                        .arg(payload.as_slice())
                        .ignore();
                }
                let () = pipe.query_async(&mut con).await?;
                left -= n;
            }
            Ok::<_, redis::RedisError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn total_len(con: &mut Connection, stream: &StreamName) -> Result<u64> {
    let mut total = 0;
    for s in 0..SHARDS {
        let len: u64 = redis::cmd("XLEN").arg(shard_key(stream, s)).query_async(con).await?;
        total += len;
    }
    Ok(total)
}

/// Entries pending in `group` over every shard (`XPENDING` summaries).
async fn pending_total(con: &mut Connection, stream: &StreamName, group: &str) -> Result<u64> {
    let reads = (0..SHARDS).map(|s| {
        let mut con = con.clone();
        let key = shard_key(stream, s);
        async move {
            redis::cmd("XPENDING")
                .arg(key)
                .arg(group)
                .query_async::<Value>(&mut con)
                .await
        }
    });
    let replies: Vec<Value> = futures::future::try_join_all(reads).await?;
    let mut total = 0;
    for r in replies {
        if let Value::Array(items) = r {
            if let Some(Value::Int(n)) = items.first() {
                total += u64::try_from(*n).unwrap_or(0);
            }
        }
    }
    Ok(total)
}

/// Creates the Redis consumer group `group` on every shard at `at` (`0` or `$`).
async fn create_redis_groups(con: &mut Connection, stream: &StreamName, group: &str, at: &str) -> Result<()> {
    for s in 0..SHARDS {
        let () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(shard_key(stream, s))
            .arg(group)
            .arg(at)
            .query_async(con)
            .await?;
    }
    Ok(())
}

/// Walks one `XREADGROUP` reply: pushes the entry ids to `ids`, returns the entries and the field bytes seen.
fn walk_read_reply(reply: &Value, ids: &mut Vec<Vec<u8>>) -> Result<(u64, u64)> {
    let streams = match reply {
        Value::Nil => return Ok((0, 0)),
        Value::Array(streams) => streams,
        other => bail!("unexpected XREADGROUP reply {other:?}"),
    };
    let (mut entries, mut bytes) = (0u64, 0u64);
    for stream in streams {
        let Value::Array(pair) = stream else {
            bail!("unexpected stream item {stream:?}");
        };
        let Some(Value::Array(list)) = pair.get(1) else {
            bail!("unexpected stream item {pair:?}");
        };
        for entry in list {
            let Value::Array(parts) = entry else {
                bail!("unexpected entry {entry:?}");
            };
            let (Some(Value::BulkString(id)), Some(Value::Array(fields))) = (parts.first(), parts.get(1)) else {
                bail!("unexpected entry {parts:?}");
            };
            ids.push(id.clone());
            for f in fields {
                if let Value::BulkString(b) = f {
                    bytes += b.len() as u64;
                }
            }
            entries += 1;
        }
    }
    Ok((entries, bytes))
}

/// One shard of the raw loop: pipelined `XACK` of the previous batch + `XREADGROUP` of the next, until empty.
async fn raw_shard(mut con: impl ConnectionLike, key: String, group: String, count: usize) -> Result<u64> {
    let mut ids: Vec<Vec<u8>> = Vec::with_capacity(count);
    let mut read = 0u64;
    let mut field_bytes = 0u64;
    loop {
        let mut pipe = redis::pipe();
        if !ids.is_empty() {
            pipe.cmd("XACK").arg(&key).arg(&group).arg(&ids).ignore();
        }
        pipe.cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&group)
            .arg("raw")
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&key)
            .arg(">");
        let (reply,): (Value,) = pipe.query_async(&mut con).await?;
        ids.clear();
        let (n, b) = walk_read_reply(&reply, &mut ids)?;
        read += n;
        field_bytes += b;
        if n == 0 {
            ensure!(field_bytes > 0 || read == 0, "fields were read");
            return Ok(read);
        }
    }
}

async fn raw_run(
    backend: &Backend,
    con: &mut Connection,
    nodes: &mut Nodes,
    stream: &StreamName,
    group: &str,
    count: usize,
    link: RawLink,
) -> Result<RunResult> {
    create_redis_groups(con, stream, group, "0").await?;
    // One server: a connection of the chosen kind per shard task (no manager in the way); a cluster: a cluster
    // connection per task.
    let mut single = Vec::new();
    let mut pipelined = Vec::new();
    let mut cluster = Vec::new();
    for _ in 0..SHARDS {
        match (backend, link) {
            (Backend::Single(r), RawLink::Multiplexed) => {
                single.push(redis::Client::open(r.url())?.get_multiplexed_async_connection().await?)
            }
            (Backend::Single(r), RawLink::Pipelined) => {
                let info = redis::IntoConnectionInfo::into_connection_info(r.url())?;
                pipelined.push(redis_link::PipelinedConnection::connect(&info, None, None).await?)
            }
            (Backend::Cluster(_), _) => cluster.push(backend.connection().await?),
        }
    }
    let before = Cost::now(nodes).await?;
    let start = Instant::now();
    let key = |s: usize| shard_key(stream, s as u32);
    let tasks: Vec<_> = single
        .into_iter()
        .enumerate()
        .map(|(s, con)| tokio::spawn(raw_shard(con, key(s), group.to_owned(), count)))
        .chain(
            pipelined
                .into_iter()
                .enumerate()
                .map(|(s, con)| tokio::spawn(raw_shard(con, key(s), group.to_owned(), count))),
        )
        .chain(
            cluster
                .into_iter()
                .enumerate()
                .map(|(s, con)| tokio::spawn(raw_shard(con, key(s), group.to_owned(), count))),
        )
        .collect();
    let mut read = 0;
    for t in tasks {
        read += t.await??;
    }
    let took = start.elapsed();
    let cost = Cost::now(nodes).await?.since(before);
    let pending = pending_total(con, stream, group).await?;
    ensure!(pending == 0, "raw: {pending} entries left pending");
    Ok(RunResult {
        records: read,
        took,
        cost,
        rss_before_mib: 0.0,
        peak_rss_mib: None,
    })
}

/// Timings of the benchmark group: the defaults scaled down so joins settle quickly.
fn timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: 3_000,
        heartbeat_interval_ms: 300,
        rebalance_timeout_ms: 5_000,
        assignment_lease_ms: 2_400,
    }
}

struct SdkEnv<'a> {
    coordinator: &'a CoordinatorHandle,
    redis_url: String,
    stream: &'a StreamName,
    count: usize,
}

/// Waits until the members read every shard between them, nothing pending or revoking, each at least one.
async fn settled(members: &[ConsumerHandle], deadline: Duration) -> Result<()> {
    let until = Instant::now() + deadline;
    loop {
        let statuses: Vec<_> = members.iter().map(ConsumerHandle::status).collect();
        let reading: usize = statuses.iter().map(|s| s.reading.len()).sum();
        if reading == SHARDS as usize
            && statuses
                .iter()
                .all(|s| !s.reading.is_empty() && s.pending.is_empty() && s.revoking.is_empty())
        {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("members did not settle within {deadline:?}: {statuses:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn sdk_run(
    env: &SdkEnv<'_>,
    con: &mut Connection,
    nodes: &mut Nodes,
    group: &str,
    members: usize,
) -> Result<RunResult> {
    let stream = env.stream;
    env.coordinator
        .coordinator()
        .create_group(
            stream,
            &GroupName::new(group)?,
            &CreateGroupRequest {
                shard_count: Some(SHARDS),
                timings: Some(timings()),
            },
        )
        .await
        .context("create the coordinator group")?;
    // At the end of every shard: the members join and settle without reading anything.
    create_redis_groups(con, stream, group, "$").await?;
    let handled = Arc::new(AtomicU64::new(0));
    let target = Arc::new(AtomicU64::new(u64::MAX));
    let done = Arc::new(Notify::new());
    let t = timings();
    let mut handles = Vec::new();
    for m in 0..members {
        let (handled, target, done) = (handled.clone(), target.clone(), done.clone());
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
    settled(&handles, Duration::from_secs(30)).await?;
    let expected = total_len(con, stream).await? + u64::from(SHARDS);
    target.store(expected, Ordering::Relaxed);
    // One pipeline per shard (one slot each), sent together.
    let wake = (0..SHARDS).map(|s| {
        let key = shard_key(stream, s);
        let mut pipe = redis::pipe();
        pipe.cmd("XGROUP").arg("SETID").arg(&key).arg(group).arg("0").ignore();
        pipe.cmd("XADD").arg(&key).arg("*").arg("w").arg("1").ignore();
        let mut con = con.clone();
        async move { pipe.query_async::<()>(&mut con).await }
    });
    let before = Cost::now(nodes).await?;
    let start = Instant::now();
    futures::future::try_join_all(wake).await?;
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

/// The medians of one mode's runs.
struct Summary {
    rate: f64,
    min: f64,
    max: f64,
    client_us: f64,
    redis_us: f64,
    xreadgroup_per_1000: f64,
    xack_per_1000: f64,
    /// Round 1's memory (`rss <before> -> peak <peak> MiB`).
    memory: String,
}

impl Summary {
    fn of(runs: &[RunResult]) -> Option<Summary> {
        if runs.is_empty() {
            return None;
        }
        let per_record = |f: &dyn Fn(&RunResult) -> f64| median(runs.iter().map(|r| f(r) / r.records.max(1) as f64));
        let rates: Vec<f64> = runs.iter().map(|r| rate(r.records, r.took)).collect();
        Some(Summary {
            rate: median(rates.iter().copied()),
            min: rates.iter().copied().fold(f64::INFINITY, f64::min),
            max: rates.iter().copied().fold(0.0, f64::max),
            client_us: per_record(&|r| r.cost.client_cpu_s * 1e6),
            redis_us: per_record(&|r| r.cost.redis_cpu_s * 1e6),
            xreadgroup_per_1000: per_record(&|r| r.cost.xreadgroup_calls as f64 * 1000.0),
            xack_per_1000: per_record(&|r| r.cost.xack_calls as f64 * 1000.0),
            memory: runs[0].memory(),
        })
    }

    /// The table's columns after the client CPU.
    fn rest(&self) -> String {
        format!(
            "{:.2} us | {:.1} + {:.1} | {}",
            self.redis_us, self.xreadgroup_per_1000, self.xack_per_1000, self.memory
        )
    }
}

/// The median (the mean of the middle two for an even count).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The 1-minute load average, as `/proc/loadavg` gives it.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "n/a".to_owned())
}

fn rate(n: u64, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let backend = Backend::start(args.cluster).await?;
    let mut con = backend.connection().await?;
    let mut nodes = Nodes::open(&backend).await?;
    let stream = StreamName::new("cbench")?;

    let mut config = coord_server::Config::new(backend.target());
    config.listen = "127.0.0.1:0".parse()?;
    // Short enough for the benchmark's 2.4 s lease (`Config::check_timings`).
    config.mutex_ttl = Duration::from_millis(1_200);
    config.critical_section_timeout = Duration::from_millis(1_000);
    let coordinator = CoordinatorHandle::spawn(config).await.context("coordinator")?;

    let payload = vec![b'x'; args.payload_bytes];
    let t = Instant::now();
    preload(&backend, &stream, args.records, &payload).await?;
    let loaded = total_len(&mut con, &stream).await?;
    ensure!(loaded == args.records as u64, "{loaded} entries loaded");
    println!(
        "{} records of {} B payload pre-loaded into {SHARDS} shards in {:.2?}; COUNT {} for both; \
         SDK members {:?}; {} interleaved rounds (medians reported); allocator {}",
        args.records,
        args.payload_bytes,
        t.elapsed(),
        args.count,
        args.members,
        args.rounds,
        examples::ALLOCATOR
    );

    let env = SdkEnv {
        coordinator: &coordinator,
        redis_url: backend.target(),
        stream: &stream,
        count: args.count,
    };
    // Every run of every mode, in round order.
    // A cluster's raw loop has one kind of connection.
    let raw_links: Vec<RawLink> = if args.cluster {
        vec![RawLink::Multiplexed]
    } else {
        args.raw_links.clone()
    };
    let mut raw_runs: Vec<Vec<RunResult>> = raw_links.iter().map(|_| Vec::new()).collect();
    let mut sdk_runs: Vec<Vec<RunResult>> = (0..args.members.len()).map(|_| Vec::new()).collect();
    for round in 1..=args.rounds {
        for (link, runs) in raw_links.iter().zip(&mut raw_runs).filter(|_| !args.no_raw) {
            let group = format!("raw-{link:?}-r{round}");
            let run = measured(raw_run(
                &backend, &mut con, &mut nodes, &stream, &group, args.count, *link,
            ))
            .await?;
            println!(
                "round {round} raw {:<21} {:>9.0} records/s ({} in {:.2?}; {}; {})",
                link.label(),
                rate(run.records, run.took),
                run.records,
                run.took,
                run.cost.per_record(run.records),
                run.memory()
            );
            runs.push(run);
        }
        for (i, &members) in args.members.iter().enumerate().filter(|_| !args.no_sdk) {
            let group = format!("sdk{members}-r{round}");
            let run = measured(sdk_run(&env, &mut con, &mut nodes, &group, members)).await?;
            println!(
                "round {round} sdk {members} member{} {:>9.0} records/s ({} in {:.2?}; {}; {})",
                if members == 1 { " " } else { "s" },
                rate(run.records, run.took),
                run.records,
                run.took,
                run.cost.per_record(run.records),
                run.memory()
            );
            sdk_runs[i].push(run);
        }
    }

    println!();
    println!(
        "## Consumer throughput ({} records, {} B payload, {SHARDS} shards, COUNT {}{}; medians of {} interleaved \
         rounds, load average {})",
        args.records,
        args.payload_bytes,
        args.count,
        if args.cluster { ", local 3-master cluster" } else { "" },
        args.rounds,
        load_average()
    );
    println!(
        "| run | median records/s | min - max | SDK / raw (goal >= 0.90) | client CPU/record | vs raw (goal <= 1.15) \
         | redis CPU/record | XREADGROUP + XACK per 1000 records | memory of this process, round 1 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let raws: Vec<(RawLink, Summary)> = raw_links
        .iter()
        .zip(&raw_runs)
        .filter_map(|(link, runs)| Some((*link, Summary::of(runs)?)))
        .collect();
    // Two baselines, each the strongest raw loop by its own measure: the best median rate for the rate ratio,
    // the lowest client CPU per record for the CPU ratio (usually the `pipelined` loop for the CPU, either for
    // the rate: Redis is the limit).
    let by_rate = raws.iter().max_by(|a, b| a.1.rate.total_cmp(&b.1.rate)).map(|(_, s)| s);
    let by_cpu = raws
        .iter()
        .min_by(|a, b| a.1.client_us.total_cmp(&b.1.client_us))
        .map(|(_, s)| s);
    let ratios = |s: &Summary| match (by_rate, by_cpu) {
        (Some(rate), Some(cpu)) => (
            format!("{:.3}", s.rate / rate.rate),
            format!("{:.2}", s.client_us / cpu.client_us),
        ),
        _ => ("n/a".to_owned(), "n/a".to_owned()),
    };
    for (link, summary) in &raws {
        let (ratio, cpu) = ratios(summary);
        let marks: Vec<&str> = [
            by_rate
                .is_some_and(|r| std::ptr::eq(r, summary))
                .then_some("rate baseline"),
            by_cpu
                .is_some_and(|r| std::ptr::eq(r, summary))
                .then_some("CPU baseline"),
        ]
        .into_iter()
        .flatten()
        .collect();
        println!(
            "| raw XREADGROUP + pipelined XACK (8 shard tasks, {}){} | {:.0} | {:.0} - {:.0} | {ratio} | {:.2} us | {cpu} | {} |",
            if args.cluster { "cluster connections" } else { link.label() },
            if marks.is_empty() { String::new() } else { format!(" ({})", marks.join(", ")) },
            summary.rate,
            summary.min,
            summary.max,
            summary.client_us,
            summary.rest()
        );
    }
    for (&members, runs) in args.members.iter().zip(&sdk_runs).filter(|_| !args.no_sdk) {
        let Some(sdk) = Summary::of(runs) else { continue };
        let (ratio, cpu) = ratios(&sdk);
        println!(
            "| SDK, {members} member{} (no-op handler, XACK on) | {:.0} | {:.0} - {:.0} | {ratio} | {:.2} us | {cpu} | {} |",
            if members == 1 { "" } else { "s" },
            sdk.rate,
            sdk.min,
            sdk.max,
            sdk.client_us,
            sdk.rest()
        );
    }
    coordinator.shutdown().await;
    drop(backend);
    Ok(())
}
