//! What a round measures besides its time: client and Redis CPU, the entries written, medians, the load,
//! and the `redis-benchmark` reference.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use protocol::names::StreamName;
use protocol::{keys, ShardId};

use crate::args::Args;

/// `redis-benchmark` against the private server: its own rate (records/s) and the CPU seconds of the child.
pub(crate) fn redis_benchmark_run(port: u16, args: &Args) -> Result<f64> {
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
pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Redis's CPU seconds (user + system) so far.
pub(crate) async fn redis_cpu(con: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(con).await?;
    Ok(info
        .lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum())
}

/// `usec` and `calls` of `XADD` and `EVALSHA` since the last `CONFIG RESETSTAT`.
pub(crate) async fn command_usec(con: &mut redis::aio::MultiplexedConnection) -> Result<String> {
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

/// CPU seconds of this process (all its threads, at the scheduler's precision: `benches::cpu`) and of its
/// waited-for children (redis-benchmark; `/proc/self/stat`, clock ticks of 1/100 s, Linux's fixed `USER_HZ`).
pub(crate) fn process_cpu() -> (f64, f64) {
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
    (benches::cpu::process_cpu_seconds(), children / TICKS_PER_SECOND)
}

/// What one round of one mode measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) rate: f64,
    pub(crate) client_cpu_us: f64,
    pub(crate) redis_cpu_us: f64,
    pub(crate) rss_before_mib: f64,
    pub(crate) peak_rss_mib: Option<f64>,
}

pub(crate) fn median_of(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(&samples.iter().map(f).collect::<Vec<_>>())
}

/// The reference keys redis-benchmark writes (`-r <shards>` over `bench-reference:__rand_int__`).
pub(crate) async fn reference_keys(con: &mut redis::aio::MultiplexedConnection) -> Result<Vec<String>> {
    Ok(redis::cmd("KEYS").arg("bench-reference:*").query_async(con).await?)
}

pub(crate) async fn clear(con: &mut redis::aio::MultiplexedConnection, stream: &StreamName, shards: u32) -> Result<()> {
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

pub(crate) async fn total_len(
    con: &mut redis::aio::MultiplexedConnection,
    stream: &StreamName,
    shards: u32,
) -> Result<u64> {
    let mut streams: Vec<String> = (0..shards).map(|s| keys::shard_stream(stream, ShardId(s))).collect();
    streams.extend(reference_keys(con).await?);
    let mut total = 0;
    for key in streams {
        let n: u64 = redis::cmd("XLEN").arg(key).query_async(con).await?;
        total += n;
    }
    Ok(total)
}

pub(crate) fn rate(records: usize, took: Duration) -> f64 {
    records as f64 / took.as_secs_f64()
}

pub(crate) fn median(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The 1-minute load average (Linux), to print with every figure.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "n/a".into())
}
