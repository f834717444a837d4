//! Producer benchmark: the SDK's publish paths against the strongest raw pipelined `XADD` loop this program can
//! find, on the same records, in the same run, against one private `redis-server` this program starts (and
//! kills) itself.
//!
//! ```text
//! cargo run --release -p examples --bin producer_bench -- --records 300000 --rounds 3
//! ```
//!
//! * raw: a pipelined `XADD <shard stream> * p <payload>` loop in one of several shapes (`--raw-shapes`:
//!   connections x tasks x pipeline depth, optionally grouped by shard, or hand-written RESP on plain sockets).
//!   Short interleaved calibration rounds of every shape (`--calibration-records`, `--calibration-rounds`)
//!   rank them (the table says which shapes were tried and how fast they were); the best `--raw-finalists`,
//!   plus the best redis-rs and the best hand-written shape, run in the main rounds as modes of their own, and
//!   the finalist with the best median there is the baseline of every ratio.
//! * sdk-batch: `--sdk-tasks` tasks calling `Producer::send_batch` with `--sdk-batch` records each (the SDK
//!   routes them, groups them by shard and writes each shard batch fenced: on one server as a checked
//!   transaction, `WATCH` + `HGET` of the fence, then `MULTI`, the `XADD`s, `EXEC`; on a cluster as one `EVALSHA`
//!   of the publish script: the default publish path).
//! * sdk-plain: the same with `fencing(false)`: plain pipelined `XADD`s, one pipeline per shard.
//! * sdk-idem: the same with the fenced script and `idempotence(true)` (one call per shard in flight, sequence
//!   state checked and advanced by the script).
//! * sdk-enqueue / sdk-enqueue-idem / sdk-enqueue-plain: `--sdk-tasks` tasks calling `Producer::enqueue` one
//!   record at a time (the batching mode), fenced without and with idempotence, and unfenced; every `Delivery` is
//!   awaited.
//! * sdk-durable / sdk-durable-plain / sdk-enqueue-durable (need `--replica`): `send_batch` fenced and plain, and
//!   `enqueue` fenced, with `Durability::Replicas { min: --durable-replicas, timeout: --durable-timeout-ms }`:
//!   every write request ends with `WAIT`, and Written means the replica confirmed it (issue 30).
//! * redis-benchmark (on by default when `redis-benchmark` is on `PATH`): `redis-benchmark -P <pipeline> -c
//!   <raw-connections> XADD` against the same server, one round with the others, as the physical reference (over
//!   `--shards` keys; printed, not the baseline).
//!
//! Fairness: every mode builds its commands or `Record`s inside the timed section from the same inputs (the keys,
//! one payload, the shard stream names); the raw loop computes each record's shard inside the clock too. Every
//! reply and every delivery is awaited, and the entries written are counted after each round. Each mode runs
//! `--rounds` times, interleaved (round 1 of every mode, then round 2, ...); the summary gives the median rate,
//! its spread (min and max), and per record the median client CPU (this process's threads' time on a CPU, in
//! nanoseconds from the scheduler, `examples::cpu`, which covers the in-process coordinator as well, idle during
//! a round; for redis-benchmark the CPU of the child process, in 10 ms ticks) and Redis CPU (`INFO cpu` of the private server), and the process's resident
//! memory (`VmRSS` before the mode, and its peak during the mode from `VmHWM`, reset before the mode through
//! `/proc/self/clear_refs` where the kernel allows it). The load average is printed with every round.
//!
//! `--replica`: a second private `redis-server` replicates the first for the whole run (every mode pays for feeding
//! it; the durable modes wait for it):
//!
//! ```text
//! cargo run --release -p examples --bin producer_bench -- --replica --records 200000 --rounds 3 \
//!     --modes raw,sdk-batch,sdk-durable,sdk-plain,sdk-durable-plain,sdk-enqueue,sdk-enqueue-durable
//! ```
//!
//! `--cluster`: the same records against a local 3-master Redis Cluster this program starts (the coordinator keeps
//! its metadata on the cluster too: the shard records a fenced write checks live with the shards): raw-cluster (`--sdk-tasks` tasks, each taking `--sdk-batch`
//! records, grouping them by shard and sending one pipeline of `XADD`s per shard, concurrently, through redis-rs's
//! cluster connection; a pipeline over several slots, even of one node, is refused by that connection, so one
//! shard per pipeline is the raw loop's best shape) against the SDK modes with a `cluster:` target, interleaved
//! rounds, ratios to raw-cluster printed. Client CPU is this process's; Redis CPU is the sum over the masters.
//!
//! ```text
//! cargo run --release -p examples --bin producer_bench -- --cluster --records 200000 --rounds 3
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::{ArgAction, Parser};
use coord_server::server::CoordinatorHandle;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::routing::shard_for_key;
use protocol::{keys, ShardId};
use stream_producer::{BatchingConfig, Durability, Producer, Record};

/// One shape of the raw loop: `connections` multiplexed redis-rs connections shared by `tasks` tasks (task `t`
/// uses connection `t % connections`), each task sending pipelines of `depth` `XADD`s and awaiting every reply
/// before its next pipeline; `grouped`: the commands of a pipeline are sorted by shard stream. Written `CxTxD`,
/// `CxTxDg` grouped; `CxCxDr` (grouped too) is the same loop without redis-rs: each task owns a plain TCP
/// socket, encodes the RESP of its pipeline by hand into one reused buffer and counts the replies with a minimal
/// parser (the loop redis-benchmark runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RawShape {
    connections: usize,
    tasks: usize,
    depth: usize,
    grouped: bool,
    resp: bool,
}

impl FromStr for RawShape {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (body, grouped, resp) = if let Some(body) = s.strip_suffix('g') {
            (body, true, false)
        } else if let Some(body) = s.strip_suffix('r') {
            (body, true, true)
        } else {
            (s, false, false)
        };
        let parts: Vec<usize> = body
            .split('x')
            .map(|p| p.parse::<usize>().map_err(|e| format!("{s:?}: {e}")))
            .collect::<Result<_, _>>()?;
        let [connections, tasks, depth] = parts[..] else {
            return Err(format!(
                "{s:?}: expected CONNECTIONSxTASKSxDEPTH, optionally followed by g"
            ));
        };
        if connections == 0 || tasks == 0 || depth == 0 {
            return Err(format!("{s:?}: every number must be at least 1"));
        }
        if resp && tasks != connections {
            return Err(format!(
                "{s:?}: a hand-written RESP shape has one task per socket (CxCxDr)"
            ));
        }
        Ok(RawShape {
            connections,
            tasks,
            depth,
            grouped,
            resp,
        })
    }
}

impl fmt::Display for RawShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = match (self.resp, self.grouped) {
            (true, _) => "r",
            (false, true) => "g",
            (false, false) => "",
        };
        write!(f, "{}x{}x{}{g}", self.connections, self.tasks, self.depth)
    }
}

#[derive(Parser, Debug, Clone)]
#[command(about = "The strongest raw pipelined XADD loop vs the producer SDK, same records, same run")]
struct Args {
    /// Records per run.
    #[arg(long, default_value_t = 500_000)]
    records: usize,
    /// Payload size of every record, in bytes.
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: usize,
    /// Shards of the stream.
    #[arg(long, default_value_t = 8)]
    shards: u32,
    /// Raw loop: connections of the redis-benchmark-like shape (one task per connection, ungrouped pipelines of
    /// `--pipeline`), always among the shapes tried unless `--raw-shapes` is given; also redis-benchmark's `-c`.
    #[arg(long, default_value_t = 50)]
    raw_connections: usize,
    /// Raw loop: XADDs per pipeline of the redis-benchmark-like shape; also redis-benchmark's `-P`.
    #[arg(long, default_value_t = 32)]
    pipeline: usize,
    /// Raw loop shapes to try, comma-separated `CONNECTIONSxTASKSxDEPTH`, a trailing `g` groups each pipeline by
    /// shard (e.g. `1x4x256g`), a trailing `r` is the hand-written RESP loop on plain sockets (`2x2x256r`).
    /// Default: the redis-benchmark-like shape, every combination of 1, 2, 4 connections x 4, 8, 16, 32 tasks x
    /// depth 64, 256, 512 grouped, and RESP loops of 1x1x256, 2x2x256, 2x2x512, 4x4x256, 4x4x512, 8x8x256.
    #[arg(long, value_delimiter = ',')]
    raw_shapes: Option<Vec<RawShape>>,
    /// Records of one calibration round of a raw shape (0: no calibration, every shape runs in the main rounds).
    #[arg(long, default_value_t = 60_000)]
    calibration_records: usize,
    /// Interleaved calibration rounds per raw shape.
    #[arg(long, default_value_t = 2)]
    calibration_rounds: usize,
    /// Raw shapes with the best calibration medians that go on to the main rounds (plus the best redis-rs and
    /// the best hand-written RESP shape if not among them); the best median there is the baseline of the ratios.
    #[arg(long, default_value_t = 2)]
    raw_finalists: usize,
    /// SDK: publishing connections (the SDK's default).
    #[arg(long, default_value_t = 8)]
    sdk_connections: usize,
    /// SDK: concurrent caller tasks. 32: the fenced path holds a turn for two round trips (the fence check, then
    /// the writes), so it needs about twice the records in flight of a plain pipeline for the same rate (16 tasks
    /// measured 0.75 to 0.78 of the raw loop, 32 tasks 0.84 to 0.91, BENCHMARKS.md); the raw shapes go to 32
    /// tasks as well.
    #[arg(long, default_value_t = 32)]
    sdk_tasks: usize,
    /// SDK enqueue: concurrent caller tasks, each keeping `--delivery-window` deliveries outstanding (4, the
    /// issue's setup: every caller here is a hot loop, and with 16 or 32 of them the producer's one sending task
    /// waits behind them in tokio's run queue: fenced, 0.71 to 0.77 of the raw loop with 32 callers against 0.79 to
    /// 0.88 with 4, BENCHMARKS.md).
    #[arg(long, default_value_t = 4)]
    enqueue_tasks: usize,
    /// SDK send_batch: records per call.
    #[arg(long, default_value_t = 1024)]
    sdk_batch: usize,
    /// SDK batching mode: max batch size.
    #[arg(long, default_value_t = 1024)]
    max_batch_size: usize,
    /// SDK batching mode: batches written at once (default: the SDK's default).
    #[arg(long)]
    max_in_flight_batches: Option<usize>,
    /// SDK enqueue: deliveries a caller task keeps outstanding before it awaits the oldest.
    #[arg(long, default_value_t = 4096)]
    delivery_window: usize,
    /// Rounds per mode (the median is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Modes to run, comma-separated (raw, sdk-batch, sdk-plain, sdk-idem, sdk-enqueue, sdk-enqueue-idem,
    /// sdk-enqueue-plain, and with `--replica` sdk-durable, sdk-durable-plain, sdk-enqueue-durable); ratios need raw.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raw,sdk-batch,sdk-plain,sdk-idem,sdk-enqueue,sdk-enqueue-idem,sdk-enqueue-plain"
    )]
    modes: Vec<String>,
    /// The redis-server binary.
    #[arg(long, default_value = "redis-server")]
    redis_server: String,
    /// Print, per round, `INFO commandstats` of Redis (usec of `XADD` and `EVALSHA`), reset before every round.
    #[arg(long)]
    commandstats: bool,
    /// Run `redis-benchmark -P <pipeline> -c <raw-connections> -r <shards> XADD` once per round, as the
    /// physical reference (`--redis-benchmark=false` to skip; skipped when `redis-benchmark` is not on `PATH`).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_value_t = true, default_missing_value = "true")]
    redis_benchmark: bool,
    /// Run against a local 3-master Redis Cluster instead (raw-cluster vs the SDK modes, see the module docs).
    #[arg(long)]
    cluster: bool,
    /// Attach a replica (a second private redis-server) to the server for the whole run; the durable modes need it.
    #[arg(long)]
    replica: bool,
    /// Durable modes: replicas that must confirm every write (`Durability::Replicas { min }`).
    #[arg(long, default_value_t = 1)]
    durable_replicas: u32,
    /// Durable modes: how long the master waits for them (`Durability::Replicas { timeout }`), in ms.
    #[arg(long, default_value_t = 1000)]
    durable_timeout_ms: u64,
}

impl Args {
    /// The raw shapes to try, the redis-benchmark-like one first.
    fn shapes(&self) -> Vec<RawShape> {
        if let Some(shapes) = &self.raw_shapes {
            return shapes.clone();
        }
        let mut shapes = vec![RawShape {
            connections: self.raw_connections,
            tasks: self.raw_connections,
            depth: self.pipeline,
            grouped: false,
            resp: false,
        }];
        for connections in [1, 2, 4] {
            for tasks in [4, 8, 16, 32] {
                for depth in [64, 256, 512] {
                    shapes.push(RawShape {
                        connections,
                        tasks,
                        depth,
                        grouped: true,
                        resp: false,
                    });
                }
            }
        }
        for (sockets, depth) in [(1, 256), (2, 256), (2, 512), (4, 256), (4, 512), (8, 256)] {
            shapes.push(RawShape {
                connections: sockets,
                tasks: sockets,
                depth,
                grouped: true,
                resp: true,
            });
        }
        shapes
    }
}

/// A private redis-server, killed on drop.
struct PrivateRedis {
    child: Child,
    port: u16,
}

impl PrivateRedis {
    fn start(bin: &str) -> Result<PrivateRedis> {
        Self::start_with(bin, &[])
    }

    /// A replica of `primary` (ready once [`wait_replicating`] says so).
    fn start_replica(bin: &str, primary: &PrivateRedis) -> Result<PrivateRedis> {
        Self::start_with(bin, &["--replicaof", "127.0.0.1", &primary.port.to_string()])
    }

    fn start_with(bin: &str, extra: &[&str]) -> Result<PrivateRedis> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {bin}"))?;
        Ok(PrivateRedis { child, port })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_ready(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    let start = Instant::now();
    loop {
        if let Ok(mut con) = client.get_multiplexed_async_connection().await {
            if redis::cmd("PING").query_async::<String>(&mut con).await.is_ok() {
                return Ok(con);
            }
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("redis-server at {url} not ready within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the replica at `url` reports its link to the primary up.
async fn wait_replicating(url: &str) -> Result<()> {
    let mut con = wait_ready(url).await?;
    let start = Instant::now();
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut con).await?;
        if info.lines().any(|l| l.trim() == "master_link_status:up") {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the replica at {url} has no link to its primary within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The inputs of a run, shared by every mode: keys, one payload and the shard stream names (the SDK has its own
/// from the routing). Records and commands are built from these inside the clock.
struct Workload {
    keys: Vec<String>,
    payload: Vec<u8>,
    shards: u32,
    shard_keys: Vec<String>,
}

impl Workload {
    fn new(args: &Args, stream: &StreamName) -> Workload {
        Workload {
            keys: (0..args.records).map(|i| format!("key-{}", i % args.keys)).collect(),
            payload: vec![b'x'; args.payload_bytes],
            shards: args.shards,
            shard_keys: (0..args.shards)
                .map(|s| keys::shard_stream(stream, ShardId(s)))
                .collect(),
        }
    }

    fn record(&self, i: usize) -> Record {
        Record::with_key(self.keys[i].as_str()).field("p", self.payload.as_slice())
    }
}

/// Multiplexed connections with the SDK's default response deadline (5 s), so deep pipelines on a busy machine
/// do not time out where the SDK would not.
async fn raw_connections(url: &str, n: usize) -> Result<Vec<redis::aio::MultiplexedConnection>> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(5)));
    let mut cons = Vec::with_capacity(n);
    for _ in 0..n {
        cons.push(client.get_multiplexed_async_connection_with_config(&config).await?);
    }
    Ok(cons)
}

/// The raw loop in one shape over the first `n` records: connections are opened before the clock starts;
/// shards, pipelines and commands are built inside it.
async fn raw_run(url: &str, shape: RawShape, n: usize, work: &Arc<Workload>) -> Result<Duration> {
    if shape.resp {
        return resp_run(url, shape, n, work).await;
    }
    let cons = raw_connections(url, shape.connections).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let depth = shape.depth;
    let start = Instant::now();
    let tasks: Vec<_> = (0..shape.tasks)
        .map(|t| {
            let mut con = cons[t % cons.len()].clone();
            let work = work.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut order: Vec<(usize, usize)> = Vec::with_capacity(depth);
                loop {
                    let from = next.fetch_add(depth, Ordering::Relaxed);
                    if from >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let to = (from + depth).min(n);
                    order.clear();
                    order.extend((from..to).map(|i| (shard_for_key(work.keys[i].as_bytes(), work.shards).index(), i)));
                    if shape.grouped {
                        order.sort_unstable();
                    }
                    let mut pipe = redis::pipe();
                    for &(shard, _) in &order {
                        pipe.cmd("XADD")
                            .arg(work.shard_keys[shard].as_str())
                            .arg("*")
                            .arg("p")
                            .arg(work.payload.as_slice());
                    }
                    let replies: Vec<redis::Value> = pipe.query_async(&mut con).await?;
                    ensure!(
                        replies.len() == to - from,
                        "{} replies to {} XADDs",
                        replies.len(),
                        to - from
                    );
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// The hand-written loop: one plain socket per task, pipelines encoded as RESP into one reused buffer (inside the
/// clock, like every other mode's commands), replies counted by [`skip_replies`].
async fn resp_run(url: &str, shape: RawShape, n: usize, work: &Arc<Workload>) -> Result<Duration> {
    use tokio::io::AsyncWriteExt;
    let addr = url.strip_prefix("redis://").context("a redis:// url")?;
    let mut sockets = Vec::with_capacity(shape.tasks);
    for _ in 0..shape.tasks {
        let socket = tokio::net::TcpStream::connect(addr).await?;
        socket.set_nodelay(true)?;
        sockets.push(socket);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let depth = shape.depth;
    let start = Instant::now();
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|mut socket| {
            let work = work.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut order: Vec<(usize, usize)> = Vec::with_capacity(depth);
                let mut out: Vec<u8> = Vec::with_capacity(depth * (work.payload.len() + 96));
                let mut replies = ReplyBuffer::default();
                loop {
                    let from = next.fetch_add(depth, Ordering::Relaxed);
                    if from >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let to = (from + depth).min(n);
                    order.clear();
                    order.extend((from..to).map(|i| (shard_for_key(work.keys[i].as_bytes(), work.shards).index(), i)));
                    order.sort_unstable();
                    out.clear();
                    for &(shard, _) in &order {
                        encode_xadd(&mut out, work.shard_keys[shard].as_bytes(), &work.payload);
                    }
                    socket.write_all(&out).await?;
                    skip_replies(&mut socket, &mut replies, to - from).await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// Appends `XADD <key> * p <payload>` in RESP.
fn encode_xadd(out: &mut Vec<u8>, key: &[u8], payload: &[u8]) {
    use std::io::Write;
    out.extend_from_slice(b"*5\r\n$4\r\nXADD\r\n");
    let _ = write!(out, "${}\r\n", key.len());
    out.extend_from_slice(key);
    out.extend_from_slice(b"\r\n$1\r\n*\r\n$1\r\np\r\n");
    let _ = write!(out, "${}\r\n", payload.len());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// Bytes read from a socket and not yet parsed.
#[derive(Default)]
struct ReplyBuffer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// Reads and checks `n` replies of `XADD` (bulk strings; an error reply fails the run).
async fn skip_replies(socket: &mut tokio::net::TcpStream, r: &mut ReplyBuffer, mut n: usize) -> Result<()> {
    use tokio::io::AsyncReadExt;
    while n > 0 {
        if let Some(used) = one_reply(&r.buf[r.start..r.end])? {
            r.start += used;
            n -= 1;
            continue;
        }
        r.buf.copy_within(r.start..r.end, 0);
        r.end -= r.start;
        r.start = 0;
        if r.buf.len() < r.end + 16 * 1024 {
            r.buf.resize(r.end + 64 * 1024, 0);
        }
        let got = socket.read(&mut r.buf[r.end..]).await?;
        ensure!(got > 0, "redis closed the connection with {n} replies outstanding");
        r.end += got;
    }
    Ok(())
}

/// The length of the first complete reply in `b`, if there is one.
fn one_reply(b: &[u8]) -> Result<Option<usize>> {
    let Some(nl) = b.iter().position(|&c| c == b'\n') else {
        return Ok(None);
    };
    let line = &b[..nl.saturating_sub(1)];
    match line.first() {
        Some(b'$') => {
            let len: usize = std::str::from_utf8(&line[1..])?.parse()?;
            let total = nl + 1 + len + 2;
            Ok((b.len() >= total).then_some(total))
        }
        Some(b'+' | b':') => Ok(Some(nl + 1)),
        _ => bail!("unexpected reply to XADD: {}", String::from_utf8_lossy(line)),
    }
}

async fn sdk_batch_run(producer: &Arc<Producer>, args: &Args, work: &Arc<Workload>) -> Result<Duration> {
    let n = work.keys.len();
    let batch = args.sdk_batch;
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.sdk_tasks)
        .map(|_| {
            let producer = producer.clone();
            let work = work.clone();
            let next = next.clone();
            tokio::spawn(async move {
                loop {
                    let from = next.fetch_add(batch, Ordering::Relaxed);
                    if from >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let to = (from + batch).min(n);
                    let records: Vec<Record> = (from..to).map(|i| work.record(i)).collect();
                    let published = producer.send_batch(records).await?;
                    ensure!(
                        published.len() == to - from,
                        "{} outcomes of {}",
                        published.len(),
                        to - from
                    );
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

async fn sdk_enqueue_run(producer: &Arc<Producer>, args: &Args, work: &Arc<Workload>) -> Result<Duration> {
    let n = work.keys.len();
    let per_task = n.div_ceil(args.enqueue_tasks);
    let window = args.delivery_window.max(1);
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.enqueue_tasks)
        .map(|t| {
            let producer = producer.clone();
            let work = work.clone();
            tokio::spawn(async move {
                let mut outstanding = VecDeque::with_capacity(window + 1);
                for i in t * per_task..((t + 1) * per_task).min(n) {
                    outstanding.push_back(producer.enqueue(work.record(i)).await?);
                    if outstanding.len() > window {
                        let oldest = outstanding.pop_front().expect("not empty");
                        oldest.await?;
                    }
                }
                for delivery in outstanding {
                    delivery.await?;
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// `redis-benchmark` against the private server: its own rate (records/s) and the CPU seconds of the child.
fn redis_benchmark_run(port: u16, args: &Args) -> Result<f64> {
    let payload = "x".repeat(args.payload_bytes);
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-q", "-P", &args.pipeline.to_string()])
        .args(["-c", &args.raw_connections.to_string(), "-n", &args.records.to_string()])
        .args(["-r", &args.shards.to_string()])
        .args(["XADD", "bench-reference:__rand_int__", "*", "p", &payload])
        .stdin(Stdio::null())
        .output()
        .context("redis-benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.rsplit('\r').next().unwrap_or_default().trim();
    let rate = last
        .split(" requests per second")
        .next()
        .and_then(|head| head.rsplit([' ', ':']).find(|w| !w.is_empty()))
        .and_then(|w| w.parse::<f64>().ok());
    match rate {
        Some(rate) if out.status.success() => Ok(rate),
        _ => bail!(
            "redis-benchmark: no rate in its output ({}): {}",
            out.status,
            last.replace(&payload, "<payload>")
        ),
    }
}

/// Whether a program is on `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Redis's CPU seconds (user + system) so far.
async fn redis_cpu(con: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(con).await?;
    Ok(info
        .lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum())
}

/// `usec` and `calls` of `XADD` and `EVALSHA` since the last `CONFIG RESETSTAT`.
async fn command_usec(con: &mut redis::aio::MultiplexedConnection) -> Result<String> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(con).await?;
    let mut out = Vec::new();
    for name in ["xadd", "evalsha"] {
        let prefix = format!("cmdstat_{name}:");
        if let Some(line) = info.lines().find(|l| l.starts_with(&prefix)) {
            let field = |f: &str| {
                line[prefix.len()..]
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f))
                    .unwrap_or("?")
                    .to_owned()
            };
            out.push(format!(
                "{name} calls={} usec={} usec/call={}",
                field("calls="),
                field("usec="),
                field("usec_per_call=")
            ));
        }
    }
    Ok(out.join("; "))
}

/// CPU seconds of this process (all its threads, at the scheduler's precision: `examples::cpu`) and of its
/// waited-for children (redis-benchmark; `/proc/self/stat`, clock ticks of 1/100 s, Linux's fixed `USER_HZ`).
fn process_cpu() -> (f64, f64) {
    const TICKS_PER_SECOND: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name's closing parenthesis start at field 3 (state); cutime and cstime are fields
    // 16 and 17.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let children: f64 = rest
        .split_whitespace()
        .skip(13)
        .take(2)
        .map(|w| w.parse::<f64>().unwrap_or(0.0))
        .sum();
    (examples::cpu::process_cpu_seconds(), children / TICKS_PER_SECOND)
}

/// What one round of one mode measured.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rate: f64,
    client_cpu_us: f64,
    redis_cpu_us: f64,
    rss_before_mib: f64,
    peak_rss_mib: Option<f64>,
}

fn median_of(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(&samples.iter().map(f).collect::<Vec<_>>())
}

/// The reference keys redis-benchmark writes (`-r <shards>` over `bench-reference:__rand_int__`).
async fn reference_keys(con: &mut redis::aio::MultiplexedConnection) -> Result<Vec<String>> {
    Ok(redis::cmd("KEYS").arg("bench-reference:*").query_async(con).await?)
}

async fn clear(con: &mut redis::aio::MultiplexedConnection, stream: &StreamName, shards: u32) -> Result<()> {
    let mut pipe = redis::pipe();
    for s in 0..shards {
        pipe.cmd("DEL").arg(keys::shard_stream(stream, ShardId(s))).ignore();
    }
    for key in reference_keys(con).await? {
        pipe.cmd("DEL").arg(key).ignore();
    }
    let () = pipe.query_async(con).await?;
    Ok(())
}

async fn total_len(con: &mut redis::aio::MultiplexedConnection, stream: &StreamName, shards: u32) -> Result<u64> {
    let mut streams: Vec<String> = (0..shards).map(|s| keys::shard_stream(stream, ShardId(s))).collect();
    streams.extend(reference_keys(con).await?);
    let mut total = 0;
    for key in streams {
        let n: u64 = redis::cmd("XLEN").arg(key).query_async(con).await?;
        total += n;
    }
    Ok(total)
}

fn rate(records: usize, took: Duration) -> f64 {
    records as f64 / took.as_secs_f64()
}

fn median(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The 1-minute load average (Linux), to print with every figure.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "n/a".into())
}

/// The SDK modes: name on the command line, what it runs.
const SDK_MODES: [(&str, &str); 9] = [
    ("sdk-batch", "send_batch, fenced"),
    ("sdk-plain", "send_batch, plain XADD"),
    ("sdk-idem", "send_batch, fenced+idempotent"),
    ("sdk-enqueue", "enqueue, fenced"),
    ("sdk-enqueue-idem", "enqueue, fenced+idempotent"),
    ("sdk-enqueue-plain", "enqueue, plain XADD"),
    ("sdk-durable", "send_batch, fenced, durable (WAIT)"),
    ("sdk-durable-plain", "send_batch, plain XADD, durable (WAIT)"),
    ("sdk-enqueue-durable", "enqueue, fenced, durable (WAIT)"),
];

/// One measured mode of the main rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// A raw loop finalist.
    Raw(RawShape),
    /// An SDK mode (a name of [`SDK_MODES`]).
    Sdk(&'static str),
    /// `redis-benchmark`, the physical reference.
    RedisBenchmark,
}

impl Mode {
    fn label(&self, args: &Args) -> String {
        match self {
            Mode::Raw(shape) => format!("raw {shape}"),
            Mode::Sdk(name) => SDK_MODES
                .iter()
                .find(|(m, _)| m == name)
                .map_or_else(|| name.to_string(), |(_, what)| what.to_string()),
            Mode::RedisBenchmark => format!(
                "redis-benchmark -P {} -c {} -r {} XADD",
                args.pipeline, args.raw_connections, args.shards
            ),
        }
    }
}

/// Interleaved short rounds of every raw shape over the first `n` records, after which the best
/// `--raw-finalists` shapes go on to the main rounds, together with the best redis-rs shape and the best
/// hand-written RESP shape if they are not among them. Prints every shape's median and spread.
async fn calibrate(
    redis: &PrivateRedis,
    con: &mut redis::aio::MultiplexedConnection,
    stream: &StreamName,
    args: &Args,
    work: &Arc<Workload>,
    shapes: &[RawShape],
) -> Result<Vec<RawShape>> {
    let n = args.calibration_records.min(args.records);
    let rounds = args.calibration_rounds.max(1);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); shapes.len()];
    for _ in 0..rounds {
        for (shape, rates) in shapes.iter().zip(&mut rates) {
            clear(con, stream, args.shards).await?;
            let took = raw_run(&redis.url(), *shape, n, work).await?;
            let written = total_len(con, stream, args.shards).await?;
            ensure!(
                written == n as u64,
                "raw {shape}: {written} entries written, expected {n}"
            );
            rates.push(rate(n, took));
        }
    }
    let mut ranked: Vec<(RawShape, f64, f64, f64)> = shapes
        .iter()
        .zip(&rates)
        .map(|(shape, r)| {
            let min = r.iter().copied().fold(f64::INFINITY, f64::min);
            let max = r.iter().copied().fold(0.0, f64::max);
            (*shape, median(r), min, max)
        })
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "raw shape calibration ({SHAPE_LEGEND}), {rounds} interleaved rounds of {n} records, load {}:",
        load_average()
    );
    for (shape, median, min, max) in &ranked {
        println!(
            "  {:<10} {median:>10.0} records/s  (min {min:.0}, max {max:.0})",
            shape.to_string()
        );
    }
    let mut finalists: Vec<RawShape> = ranked.iter().take(args.raw_finalists.max(1)).map(|r| r.0).collect();
    for resp in [false, true] {
        if let Some(best) = ranked.iter().map(|r| r.0).find(|s| s.resp == resp) {
            if !finalists.contains(&best) {
                finalists.push(best);
            }
        }
    }
    let names: Vec<String> = finalists.iter().map(RawShape::to_string).collect();
    println!(
        "raw finalists (the best median of the main rounds is the baseline): {}",
        names.join(", ")
    );
    Ok(finalists)
}

/// How raw shapes are written.
const SHAPE_LEGEND: &str = "connections x tasks x depth, g = grouped by shard, r = hand-written RESP";

/// `--sdk-tasks` tasks each taking `--sdk-batch` records, grouping them by shard and sending every shard's
/// pipeline of `XADD`s concurrently through one shared redis-rs cluster connection.
async fn raw_cluster_run(
    con: &redis::cluster_async::ClusterConnection,
    args: &Args,
    work: &Arc<Workload>,
) -> Result<Duration> {
    let n = work.keys.len();
    let batch = args.sdk_batch;
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.sdk_tasks)
        .map(|_| {
            let con = con.clone();
            let work = work.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); work.shards as usize];
                loop {
                    let from = next.fetch_add(batch, Ordering::Relaxed);
                    if from >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let to = (from + batch).min(n);
                    by_shard.iter_mut().for_each(Vec::clear);
                    for i in from..to {
                        by_shard[shard_for_key(work.keys[i].as_bytes(), work.shards).index()].push(i);
                    }
                    let sends = by_shard
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| !r.is_empty())
                        .map(|(shard, records)| {
                            let mut con = con.clone();
                            let mut pipe = redis::pipe();
                            for _ in records {
                                pipe.cmd("XADD")
                                    .arg(work.shard_keys[shard].as_str())
                                    .arg("*")
                                    .arg("p")
                                    .arg(work.payload.as_slice());
                            }
                            let expected = records.len();
                            async move {
                                let replies: Vec<redis::Value> = pipe.query_async(&mut con).await?;
                                ensure!(
                                    replies.len() == expected,
                                    "{} replies to {expected} XADDs",
                                    replies.len()
                                );
                                Ok(())
                            }
                        });
                    for r in futures::future::join_all(sends).await {
                        r?;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// An in-process coordinator on `redis_url` with `stream`'s routing of `shards` shards (through group `bench`).
async fn bench_coordinator(redis_url: &str, stream: &StreamName, shards: u32) -> Result<CoordinatorHandle> {
    let mut config = coord_server::Config::new(redis_url);
    config.listen = "127.0.0.1:0".parse()?;
    let coordinator = CoordinatorHandle::spawn(config).await.context("coordinator")?;
    coordinator
        .coordinator()
        .create_group(
            stream,
            &GroupName::new("bench")?,
            &CreateGroupRequest {
                shard_count: Some(shards),
                timings: None,
            },
        )
        .await
        .context("create the stream routing")?;
    Ok(coordinator)
}

/// The `--cluster` run (see the module docs).
async fn cluster_main(args: Args) -> Result<()> {
    use test_support::cluster::RedisCluster;
    let cluster = RedisCluster::start().await;
    let stream = StreamName::new("bench")?;
    let target = format!("cluster:{}", cluster.urls().join(","));
    // On the cluster itself: the shard records a fenced write checks live with the shards (issue 30).
    let coordinator = bench_coordinator(&target, &stream, args.shards).await?;
    let build = |fencing: bool, idempotence: bool| -> Result<Arc<Producer>> {
        Ok(Arc::new(
            Producer::builder(stream.as_str())
                .coordinator(coordinator.url())
                .redis(target.as_str())
                .connections(args.sdk_connections)
                .max_batch_size(args.max_batch_size)
                .queue_capacity((args.max_batch_size * 16).max(10_000))
                .max_in_flight_batches(
                    args.max_in_flight_batches
                        .unwrap_or(BatchingConfig::default().max_in_flight_batches),
                )
                .fencing(fencing)
                .idempotence(idempotence)
                .build()?,
        ))
    };
    let producers = [
        ("sdk-batch", build(true, false)?),
        ("sdk-plain", build(false, false)?),
        ("sdk-idem", build(true, true)?),
    ];
    for (_, p) in &producers {
        p.ready().await?;
    }
    let con = cluster.connection().await;
    let mut masters = Vec::new();
    for m in cluster.masters().await {
        masters.push(cluster.node(m).server().connection().await);
    }
    let work = Arc::new(Workload::new(&args, &stream));
    let mut shards_per_master = std::collections::BTreeMap::new();
    for key in &work.shard_keys {
        *shards_per_master
            .entry(cluster.owner_of_key(key).await)
            .or_insert(0usize) += 1;
    }
    println!(
        "cluster of 3 masters (shards per master {shards_per_master:?}); {} records of {} B payload, {} keys, {} \
         shards; {} tasks, send_batch of {} (raw-cluster: the same batches, one pipeline per shard); sdk {} \
         connections per master",
        args.records, args.payload_bytes, args.keys, args.shards, args.sdk_tasks, args.sdk_batch, args.sdk_connections
    );
    let mut modes: Vec<&str> = vec!["raw-cluster"];
    for name in &args.modes {
        match SDK_MODES.iter().find(|(m, _)| m == name) {
            Some((m, _)) if m.contains("durable") => bail!("{m}: the durable modes run on one server with --replica"),
            Some((m, _)) => modes.push(m),
            None if name == "raw" => {}
            None => bail!("unknown mode {name:?}"),
        }
    }
    // The enqueue modes use the producers of the matching send_batch modes.
    let producer_of = |mode: &str| {
        let name = match mode {
            "sdk-enqueue" => "sdk-batch",
            "sdk-enqueue-idem" => "sdk-idem",
            "sdk-enqueue-plain" => "sdk-plain",
            other => other,
        };
        producers.iter().find(|(m, _)| *m == name).map(|(_, p)| p)
    };
    let clear = |mut con: redis::cluster_async::ClusterConnection| {
        let keys = work.shard_keys.clone();
        async move {
            let mut total = 0u64;
            for key in &keys {
                total += redis::cmd("XLEN").arg(key).query_async::<u64>(&mut con).await?;
                let () = redis::cmd("DEL").arg(key).query_async(&mut con).await?;
            }
            Ok::<u64, anyhow::Error>(total)
        }
    };
    let redis_cpu_sum = |mut masters: Vec<redis::aio::MultiplexedConnection>| async move {
        let mut sum = 0.0;
        for m in &mut masters {
            sum += redis_cpu(m).await?;
        }
        Ok::<f64, anyhow::Error>(sum)
    };
    let mut samples: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); modes.len()];
    for round in 1..=args.rounds {
        for (mode, samples) in modes.iter().zip(&mut samples) {
            clear(con.clone()).await?;
            let redis_before = redis_cpu_sum(masters.clone()).await?;
            let (cpu_before, _) = process_cpu();
            let took = match *mode {
                "raw-cluster" => raw_cluster_run(&con, &args, &work).await?,
                name => {
                    let p = producer_of(name).context("a mode")?;
                    if name.starts_with("sdk-enqueue") {
                        sdk_enqueue_run(p, &args, &work).await?
                    } else {
                        sdk_batch_run(p, &args, &work).await?
                    }
                }
            };
            let (cpu_after, _) = process_cpu();
            let redis_after = redis_cpu_sum(masters.clone()).await?;
            let written = clear(con.clone()).await?;
            ensure!(
                written == args.records as u64,
                "{mode}: {written} entries written, expected {}",
                args.records
            );
            let per_record = 1e6 / args.records as f64;
            let sample = (
                rate(args.records, took),
                (cpu_after - cpu_before) * per_record,
                (redis_after - redis_before) * per_record,
            );
            println!(
                "round {round} {mode:<12} {:>8.0} records/s ({took:.2?})  client {:.2} us/rec  redis {:.2} us/rec  \
                 load {}",
                sample.0,
                sample.1,
                sample.2,
                load_average()
            );
            samples.push(sample);
        }
    }
    let med = |s: &[(f64, f64, f64)], f: fn(&(f64, f64, f64)) -> f64| median(&s.iter().map(f).collect::<Vec<_>>());
    let baseline = med(&samples[0], |s| s.0);
    println!();
    println!(
        "medians of {} interleaved rounds, {} records each, 3-master cluster:",
        args.rounds, args.records
    );
    println!();
    println!(
        "| mode | median records/s | min - max | ratio to raw-cluster | client CPU us/record | Redis CPU us/record |"
    );
    println!("|---|---|---|---|---|---|");
    for (mode, s) in modes.iter().zip(&samples) {
        let r = med(s, |s| s.0);
        let min = s.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
        let max = s.iter().map(|s| s.0).fold(0.0, f64::max);
        println!(
            "| {mode} | {r:.0} | {min:.0} - {max:.0} | {:.3} | {:.2} | {:.2} |",
            r / baseline,
            med(s, |s| s.1),
            med(s, |s| s.2)
        );
    }
    for (_, p) in producers {
        Arc::into_inner(p).context("all tasks finished")?.close().await?;
    }
    coordinator.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.cluster {
        return cluster_main(args).await;
    }
    let redis = PrivateRedis::start(&args.redis_server)?;
    let mut con = wait_ready(&redis.url()).await?;
    let replica = match args.replica {
        true => {
            let replica = PrivateRedis::start_replica(&args.redis_server, &redis)?;
            wait_replicating(&replica.url()).await?;
            Some(replica)
        }
        false => None,
    };
    let stream = StreamName::new("bench")?;
    let coordinator = bench_coordinator(&redis.url(), &stream, args.shards).await?;

    let durability = Durability::replicas(args.durable_replicas, Duration::from_millis(args.durable_timeout_ms));
    let build_with = |fencing: bool, idempotence: bool, durability: Durability| -> Result<Arc<Producer>> {
        Ok(Arc::new(
            Producer::builder(stream.as_str())
                .coordinator(coordinator.url())
                .redis(redis.url())
                .connections(args.sdk_connections)
                .max_batch_size(args.max_batch_size)
                .queue_capacity((args.max_batch_size * 16).max(10_000))
                .max_in_flight_batches(
                    args.max_in_flight_batches
                        .unwrap_or(BatchingConfig::default().max_in_flight_batches),
                )
                .fencing(fencing)
                .idempotence(idempotence)
                .durability(durability)
                .build()?,
        ))
    };
    let build = |fencing: bool, idempotence: bool| build_with(fencing, idempotence, Durability::Primary);
    let producer = build(true, false)?;
    let plain = build(false, false)?;
    let idempotent = build(true, true)?;
    let durable = build_with(true, false, durability)?;
    let durable_plain = build_with(false, false, durability)?;
    for p in [&plain, &idempotent] {
        p.ready().await?;
    }
    if replica.is_some() {
        for p in [&durable, &durable_plain] {
            p.ready().await?;
        }
    }
    producer.ready().await?;
    let work = Arc::new(Workload::new(&args, &stream));
    let shapes = args.shapes();
    ensure!(!shapes.is_empty(), "--raw-shapes: no shape");
    println!(
        "{} records of {} B payload, {} keys, {} shards; raw shapes tried: {}; sdk: {} connections, {} tasks, \
         send_batch of {}, batching max {} with {} batches in flight, enqueue {} tasks with a window of {} each; \
         allocator {}; {}",
        args.records,
        args.payload_bytes,
        args.keys,
        args.shards,
        shapes.len(),
        args.sdk_connections,
        args.sdk_tasks,
        args.sdk_batch,
        args.max_batch_size,
        args.max_in_flight_batches
            .unwrap_or(BatchingConfig::default().max_in_flight_batches),
        args.enqueue_tasks,
        args.delivery_window,
        examples::ALLOCATOR,
        match &replica {
            Some(r) => format!(
                "a replica attached ({}); durable modes: WAIT {} {}",
                r.url(),
                args.durable_replicas,
                args.durable_timeout_ms
            ),
            None => "no replica".to_owned(),
        }
    );
    let mut modes: Vec<Mode> = Vec::new();
    for name in &args.modes {
        if name == "raw" {
            let finalists = if shapes.len() > 1 && args.calibration_records > 0 {
                calibrate(&redis, &mut con, &stream, &args, &work, &shapes).await?
            } else {
                shapes.clone()
            };
            modes.extend(finalists.into_iter().map(Mode::Raw));
        } else {
            let (name, _) = SDK_MODES
                .iter()
                .find(|(m, _)| m == name)
                .with_context(|| format!("unknown mode {name:?}"))?;
            ensure!(
                replica.is_some() || !name.contains("durable"),
                "{name} waits for a replica: add --replica"
            );
            modes.push(Mode::Sdk(name));
        }
    }
    if args.redis_benchmark {
        if on_path("redis-benchmark") {
            modes.push(Mode::RedisBenchmark);
        } else {
            println!("redis-benchmark is not on PATH: no physical reference in this run");
        }
    }
    let peak_resettable = examples::mem::reset_peak_rss();
    if !peak_resettable {
        println!("/proc/self/clear_refs not writable: peak RSS is the process's peak so far");
    }

    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); modes.len()];
    for round in 1..=args.rounds {
        for (&mode, samples) in modes.iter().zip(&mut samples) {
            clear(&mut con, &stream, args.shards).await?;
            if args.commandstats {
                let () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut con).await?;
            }
            let rss_before = examples::mem::status_mib("VmRSS").unwrap_or(0.0);
            examples::mem::reset_peak_rss();
            let redis_before = redis_cpu(&mut con).await?;
            let (cpu_before, children_before) = process_cpu();
            let took = match mode {
                Mode::Raw(shape) => raw_run(&redis.url(), shape, args.records, &work).await?,
                Mode::Sdk("sdk-batch") => sdk_batch_run(&producer, &args, &work).await?,
                Mode::Sdk("sdk-plain") => sdk_batch_run(&plain, &args, &work).await?,
                Mode::Sdk("sdk-idem") => sdk_batch_run(&idempotent, &args, &work).await?,
                Mode::Sdk("sdk-enqueue") => sdk_enqueue_run(&producer, &args, &work).await?,
                Mode::Sdk("sdk-enqueue-idem") => sdk_enqueue_run(&idempotent, &args, &work).await?,
                Mode::Sdk("sdk-enqueue-plain") => sdk_enqueue_run(&plain, &args, &work).await?,
                Mode::Sdk("sdk-durable") => sdk_batch_run(&durable, &args, &work).await?,
                Mode::Sdk("sdk-durable-plain") => sdk_batch_run(&durable_plain, &args, &work).await?,
                Mode::Sdk("sdk-enqueue-durable") => sdk_enqueue_run(&durable, &args, &work).await?,
                Mode::Sdk(other) => bail!("unknown mode {other:?}"),
                Mode::RedisBenchmark => {
                    let port = redis.port;
                    let a = args.clone();
                    let r = tokio::task::spawn_blocking(move || redis_benchmark_run(port, &a)).await??;
                    Duration::from_secs_f64(args.records as f64 / r)
                }
            };
            let (cpu_after, children_after) = process_cpu();
            let redis_after = redis_cpu(&mut con).await?;
            let written = total_len(&mut con, &stream, args.shards).await?;
            let label = mode.label(&args);
            ensure!(
                written == args.records as u64,
                "{label}: {written} entries written, expected {}",
                args.records
            );
            let client_cpu = if mode == Mode::RedisBenchmark {
                children_after - children_before
            } else {
                cpu_after - cpu_before
            };
            let per_record = 1e6 / args.records as f64;
            let sample = Sample {
                rate: rate(args.records, took),
                client_cpu_us: client_cpu * per_record,
                redis_cpu_us: (redis_after - redis_before) * per_record,
                rss_before_mib: rss_before,
                peak_rss_mib: if peak_resettable {
                    examples::mem::status_mib("VmHWM")
                } else {
                    None
                },
            };
            println!(
                "round {round} {label:<40} {:>8.0} records/s ({took:.2?})  client {:.2} us/rec  redis {:.2} us/rec  \
                 rss {:.0} -> peak {} MiB  load {}",
                sample.rate,
                sample.client_cpu_us,
                sample.redis_cpu_us,
                sample.rss_before_mib,
                sample
                    .peak_rss_mib
                    .map_or_else(|| "n/a".to_string(), |p| format!("{p:.0}")),
                load_average()
            );
            if args.commandstats {
                println!("        {}", command_usec(&mut con).await?);
            }
            samples.push(sample);
        }
    }
    clear(&mut con, &stream, args.shards).await?;
    println!();
    let baseline = modes
        .iter()
        .zip(&samples)
        .filter(|(m, _)| matches!(m, Mode::Raw(_)))
        .map(|(m, s)| (*m, median_of(s, |s| s.rate)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    println!(
        "medians of {} interleaved rounds, {} records each (load average now {}); baseline = {} ({SHAPE_LEGEND}); \
         CPU per record: client = this process (for redis-benchmark: its own process), Redis = INFO cpu; memory: \
         this process's VmRSS before the mode and its peak (VmHWM) during the mode, in round 1:",
        args.rounds,
        args.records,
        load_average(),
        baseline.map_or_else(|| "none (raw not run)".to_string(), |(m, _)| m.label(&args))
    );
    println!();
    println!(
        "| mode | median records/s | min - max | ratio to baseline | client CPU us/record | Redis CPU us/record | \
         RSS before / peak MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (mode, s) in modes.iter().zip(&samples) {
        let r = median_of(s, |s| s.rate);
        let min = s.iter().map(|s| s.rate).fold(f64::INFINITY, f64::min);
        let max = s.iter().map(|s| s.rate).fold(0.0, f64::max);
        let ratio = baseline.map_or_else(|| "n/a".to_string(), |(_, b)| format!("{:.3}", r / b));
        let mut label = mode.label(&args);
        if baseline.is_some_and(|(m, _)| m == *mode) {
            label.push_str(" (baseline)");
        } else if *mode == Mode::RedisBenchmark {
            label.push_str(" (reference)");
        }
        let peak = s.first().and_then(|s| s.peak_rss_mib);
        println!(
            "| {label} | {r:.0} | {min:.0} - {max:.0} | {ratio} | {:.2} | {:.2} | {:.0} / {} |",
            median_of(s, |s| s.client_cpu_us),
            median_of(s, |s| s.redis_cpu_us),
            s.first().map_or(0.0, |s| s.rss_before_mib),
            peak.map_or_else(|| "n/a".to_string(), |p| format!("{p:.0}")),
        );
    }
    for p in [plain, idempotent, durable, durable_plain] {
        Arc::into_inner(p).context("all tasks finished")?.close().await?;
    }
    let producer = Arc::into_inner(producer).context("all tasks finished")?;
    producer.close().await?;
    coordinator.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_print() {
        for text in ["50x50x32", "1x4x256g", "2x2x512r"] {
            assert_eq!(text.parse::<RawShape>().expect(text).to_string(), text);
        }
        assert!(
            "2x4x256r".parse::<RawShape>().is_err(),
            "RESP shapes have one task per socket"
        );
        assert!("0x4x256".parse::<RawShape>().is_err());
        assert!("4x256".parse::<RawShape>().is_err());
    }

    #[test]
    fn replies_are_counted_whole() {
        let mut out = Vec::new();
        encode_xadd(&mut out, b"k", b"vv");
        assert_eq!(
            out,
            b"*5\r\n$4\r\nXADD\r\n$1\r\nk\r\n$1\r\n*\r\n$1\r\np\r\n$2\r\nvv\r\n"
        );
        assert_eq!(one_reply(b"$15\r\n1700000000000-0\r\n$3").unwrap(), Some(22));
        assert_eq!(one_reply(b"$15\r\n1700000000000-").unwrap(), None);
        assert_eq!(one_reply(b"$15").unwrap(), None);
        assert!(one_reply(b"-ERR wrong\r\n").is_err());
    }
}
