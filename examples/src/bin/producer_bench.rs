//! Producer benchmark: the SDK's batched publish against a raw pipelined `XADD` loop, on the same records, in
//! the same run, against one private `redis-server` this program starts (and kills) itself.
//!
//! ```text
//! cargo run --release -p examples --bin producer_bench -- --records 500000 --payload-bytes 100
//! ```
//!
//! * raw: `--raw-connections` (50) tasks, each with its own connection, sending pipelines of `--pipeline` (32)
//!   `XADD <shard stream> * p <payload>` and waiting for each answer: what `redis-benchmark -P 32 -c 50` does,
//!   with the shard of every record computed before the clock starts.
//! * sdk-batch: `--sdk-tasks` tasks calling `Producer::send_batch` with `--sdk-batch` records each (the SDK
//!   routes them, groups them by shard and sends one `EVALSHA` of the fenced publish script per shard batch: the
//!   default publish path).
//! * sdk-plain: the same with `fencing(false)`: plain pipelined `XADD`s, one pipeline per shard.
//! * sdk-idem: the same with the fenced script and `idempotence(true)` (one call per shard in flight, sequence
//!   state checked and advanced by the script).
//! * sdk-enqueue / sdk-enqueue-idem: `--sdk-tasks` tasks calling `Producer::enqueue` one record at a time (the
//!   batching mode), fenced, without and with idempotence.
//!
//! Every run writes the same records (same keys, same payload, so the same shard streams); the streams are
//! deleted between runs. Each mode runs `--rounds` times, interleaved (round 1 of every mode, then round 2, ...),
//! and the median rate of each is compared with the raw loop's median; the load average is printed with every
//! round, since the machine may be shared.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use coord_server::server::CoordinatorHandle;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::routing::shard_for_key;
use protocol::{keys, ShardId};
use stream_producer::{Producer, Record};

#[derive(Parser, Debug)]
#[command(about = "Raw pipelined XADD vs the producer SDK, same records, same run")]
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
    /// Raw loop: connections (like redis-benchmark -c).
    #[arg(long, default_value_t = 50)]
    raw_connections: usize,
    /// Raw loop: XADDs per pipeline (like redis-benchmark -P).
    #[arg(long, default_value_t = 32)]
    pipeline: usize,
    /// SDK: publishing connections.
    #[arg(long, default_value_t = 2)]
    sdk_connections: usize,
    /// SDK: concurrent caller tasks.
    #[arg(long, default_value_t = 16)]
    sdk_tasks: usize,
    /// SDK send_batch: records per call.
    #[arg(long, default_value_t = 1024)]
    sdk_batch: usize,
    /// SDK batching mode: max batch size.
    #[arg(long, default_value_t = 1024)]
    max_batch_size: usize,
    /// Rounds per mode (the median is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Modes to run, comma-separated (raw, sdk-batch, sdk-plain, sdk-idem, sdk-enqueue, sdk-enqueue-idem);
    /// ratios need raw.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raw,sdk-batch,sdk-plain,sdk-idem,sdk-enqueue,sdk-enqueue-idem"
    )]
    modes: Vec<String>,
    /// The redis-server binary.
    #[arg(long, default_value = "redis-server")]
    redis_server: String,
    /// Print, per round, where Redis spent its time: `INFO commandstats` (usec of `XADD` and `EVALSHA`) and the
    /// server's CPU seconds (`INFO cpu`), reset before every round.
    #[arg(long)]
    commandstats: bool,
    /// Also run `redis-benchmark -P <pipeline> -c <raw-connections> XADD` once, as a reference for the raw loop
    /// (one stream key; printed, not compared).
    #[arg(long)]
    redis_benchmark: bool,
}

/// A private redis-server, killed on drop.
struct PrivateRedis {
    child: Child,
    port: u16,
}

impl PrivateRedis {
    fn start(bin: &str) -> Result<PrivateRedis> {
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

/// The records of a run: keys and one shared payload.
struct Workload {
    keys: Vec<String>,
    payload: Vec<u8>,
    /// Shard stream key of every record (for the raw loop; the SDK computes its own).
    stream_keys: Vec<Arc<str>>,
}

impl Workload {
    fn new(args: &Args, stream: &StreamName) -> Workload {
        let payload = vec![b'x'; args.payload_bytes];
        let shard_keys: Vec<Arc<str>> = (0..args.shards)
            .map(|s| Arc::from(keys::shard_stream(stream, ShardId(s)).as_str()))
            .collect();
        let keys: Vec<String> = (0..args.records).map(|i| format!("key-{}", i % args.keys)).collect();
        let stream_keys = keys
            .iter()
            .map(|k| shard_keys[shard_for_key(k.as_bytes(), args.shards).index()].clone())
            .collect();
        Workload {
            keys,
            payload,
            stream_keys,
        }
    }

    fn record(&self, i: usize) -> Record {
        Record::with_key(self.keys[i].as_str()).field("p", self.payload.as_slice())
    }
}

async fn raw_run(url: &str, args: &Args, work: &Arc<Workload>) -> Result<Duration> {
    let client = redis::Client::open(url)?;
    let mut cons = Vec::new();
    for _ in 0..args.raw_connections {
        cons.push(client.get_multiplexed_async_connection().await?);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let pipeline = args.pipeline;
    let start = Instant::now();
    let tasks: Vec<_> = cons
        .into_iter()
        .map(|mut con| {
            let work = work.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let n = work.keys.len();
                loop {
                    let from = next.fetch_add(pipeline, Ordering::Relaxed);
                    if from >= n {
                        return Ok::<_, redis::RedisError>(());
                    }
                    let mut pipe = redis::pipe();
                    for i in from..(from + pipeline).min(n) {
                        pipe.cmd("XADD")
                            .arg(&*work.stream_keys[i])
                            .arg("*")
                            .arg("p")
                            .arg(work.payload.as_slice());
                    }
                    let _: Vec<redis::Value> = pipe.query_async(&mut con).await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

async fn sdk_batch_run(producer: &Arc<Producer>, args: &Args, work: &Arc<Workload>) -> Result<Duration> {
    // Records are built before the clock starts, as the raw loop's data is.
    let n = work.keys.len();
    let mut chunks: Vec<Vec<Record>> = (0..n)
        .step_by(args.sdk_batch)
        .map(|from| (from..(from + args.sdk_batch).min(n)).map(|i| work.record(i)).collect())
        .collect();
    chunks.reverse();
    let queue = Arc::new(std::sync::Mutex::new(chunks));
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.sdk_tasks)
        .map(|_| {
            let producer = producer.clone();
            let queue = queue.clone();
            tokio::spawn(async move {
                loop {
                    let chunk = queue.lock().expect("not poisoned").pop();
                    let Some(chunk) = chunk else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    producer.send_batch(chunk).await?;
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
    let per_task = n.div_ceil(args.sdk_tasks);
    let mut parts: Vec<Vec<Record>> = (0..args.sdk_tasks)
        .map(|t| {
            (t * per_task..((t + 1) * per_task).min(n))
                .map(|i| work.record(i))
                .collect()
        })
        .collect();
    let start = Instant::now();
    let tasks: Vec<_> = parts
        .drain(..)
        .map(|records| {
            let producer = producer.clone();
            tokio::spawn(async move {
                for r in records {
                    // Outcomes are checked by counting entries after the flush.
                    let _delivery = producer.enqueue(r).await?;
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    producer.flush().await?;
    Ok(start.elapsed())
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

async fn clear(con: &mut redis::aio::MultiplexedConnection, stream: &StreamName, shards: u32) -> Result<()> {
    let mut pipe = redis::pipe();
    for s in 0..shards {
        pipe.cmd("DEL").arg(keys::shard_stream(stream, ShardId(s))).ignore();
    }
    let () = pipe.query_async(con).await?;
    Ok(())
}

async fn total_len(con: &mut redis::aio::MultiplexedConnection, stream: &StreamName, shards: u32) -> Result<u64> {
    let mut total = 0;
    for s in 0..shards {
        let n: u64 = redis::cmd("XLEN")
            .arg(keys::shard_stream(stream, ShardId(s)))
            .query_async(con)
            .await?;
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

/// What a mode runs.
const MODES: [(&str, &str); 6] = [
    ("raw", "raw pipelined XADD"),
    ("sdk-batch", "send_batch, fenced script"),
    ("sdk-plain", "send_batch, plain XADD"),
    ("sdk-idem", "send_batch, fenced+idempotent"),
    ("sdk-enqueue", "enqueue, fenced script"),
    ("sdk-enqueue-idem", "enqueue, fenced+idempotent"),
];

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let redis = PrivateRedis::start(&args.redis_server)?;
    let mut con = wait_ready(&redis.url()).await?;
    let stream = StreamName::new("bench")?;

    let mut config = coord_server::Config::new(redis.url());
    config.listen = "127.0.0.1:0".parse()?;
    let coordinator = CoordinatorHandle::spawn(config).await.context("coordinator")?;
    coordinator
        .coordinator()
        .create_group(
            &stream,
            &GroupName::new("bench")?,
            &CreateGroupRequest {
                shard_count: Some(args.shards),
                timings: None,
            },
        )
        .await
        .context("create the stream routing")?;

    let build = |fencing: bool, idempotence: bool| -> Result<Arc<Producer>> {
        Ok(Arc::new(
            Producer::builder(stream.as_str())
                .coordinator(coordinator.url())
                .redis(redis.url())
                .connections(args.sdk_connections)
                .max_batch_size(args.max_batch_size)
                .queue_capacity((args.max_batch_size * 16).max(10_000))
                .fencing(fencing)
                .idempotence(idempotence)
                .build()?,
        ))
    };
    let producer = build(true, false)?;
    let plain = build(false, false)?;
    let idempotent = build(true, true)?;
    for p in [&plain, &idempotent] {
        p.ready().await?;
    }
    producer.ready().await?;
    let work = Arc::new(Workload::new(&args, &stream));
    println!(
        "{} records of {} B payload, {} keys, {} shards; raw: {} connections x pipelines of {}; \
         sdk: {} connections, {} tasks, send_batch of {}, batching max {}",
        args.records,
        args.payload_bytes,
        args.keys,
        args.shards,
        args.raw_connections,
        args.pipeline,
        args.sdk_connections,
        args.sdk_tasks,
        args.sdk_batch,
        args.max_batch_size
    );

    let mut rates: std::collections::HashMap<&str, Vec<f64>> = Default::default();
    for round in 1..=args.rounds {
        for mode in args.modes.iter().map(String::as_str) {
            clear(&mut con, &stream, args.shards).await?;
            let cpu_before = if args.commandstats {
                let () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut con).await?;
                redis_cpu(&mut con).await?
            } else {
                0.0
            };
            let took = match mode {
                "raw" => raw_run(&redis.url(), &args, &work).await?,
                "sdk-batch" => sdk_batch_run(&producer, &args, &work).await?,
                "sdk-plain" => sdk_batch_run(&plain, &args, &work).await?,
                "sdk-idem" => sdk_batch_run(&idempotent, &args, &work).await?,
                "sdk-enqueue" => sdk_enqueue_run(&producer, &args, &work).await?,
                "sdk-enqueue-idem" => sdk_enqueue_run(&idempotent, &args, &work).await?,
                other => bail!("unknown mode {other:?}"),
            };
            let written = total_len(&mut con, &stream, args.shards).await?;
            if written != args.records as u64 {
                bail!("{mode}: {written} entries written, expected {}", args.records);
            }
            let r = rate(args.records, took);
            println!(
                "round {round} {mode:<17} {r:>12.0} records/s ({took:.2?})  load {}",
                load_average()
            );
            if args.commandstats {
                let cpu = redis_cpu(&mut con).await? - cpu_before;
                println!(
                    "        redis cpu {cpu:.2} s ({:.0}% of the run); {}",
                    100.0 * cpu / took.as_secs_f64(),
                    command_usec(&mut con).await?
                );
            }
            let key = MODES.iter().find(|(m, _)| *m == mode).map_or("", |(m, _)| *m);
            rates.entry(key).or_default().push(r);
        }
    }
    clear(&mut con, &stream, args.shards).await?;
    if args.redis_benchmark {
        let payload = "x".repeat(args.payload_bytes);
        let out = Command::new("redis-benchmark")
            .args(["-p", &redis.port.to_string(), "-q", "-P", &args.pipeline.to_string()])
            .args(["-c", &args.raw_connections.to_string(), "-n", &args.records.to_string()])
            .args(["XADD", "bench-reference", "*", "p", &payload])
            .output()
            .context("redis-benchmark")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.rsplit('\r').next().unwrap_or_default().trim();
        println!(
            "redis-benchmark reference (one key): {}",
            last.replace(&payload, "<payload>")
        );
    }
    println!();
    let raw = rates.get("raw").map_or(0.0, |r| median(r));
    println!(
        "medians of {} interleaved rounds (load average now {}):",
        args.rounds,
        load_average()
    );
    for (mode, name) in MODES {
        let Some(r) = rates.get(mode).map(|r| median(r)) else {
            continue;
        };
        let ratio = if raw > 0.0 {
            format!("ratio {:.3}", r / raw)
        } else {
            "ratio n/a (raw not run)".to_string()
        };
        println!("{name:<32}{r:>12.0} records/s   {ratio}");
    }
    for p in [plain, idempotent] {
        Arc::into_inner(p).context("all tasks finished")?.close().await?;
    }
    let producer = Arc::into_inner(producer).context("all tasks finished")?;
    producer.close().await?;
    coordinator.shutdown().await;
    Ok(())
}
