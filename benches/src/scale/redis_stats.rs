//! What Redis counts, read before and after a window: commands processed, bytes received, and calls per command
//! (`INFO stats`, `INFO commandstats`); plus the raw round trips every figure is compared with.
//!
//! In Redis 7.0 both `total_commands_processed` and `INFO commandstats` count every command executed, those a
//! script ran with `redis.call` included (an `EVAL` running a `SET` and a `GET` adds 3): what clients sent is
//! counted by [`super::resp_count`]. The bench's own `INFO` calls are left out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

/// The counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// `total_commands_processed`.
    pub commands: u64,
    /// `total_net_input_bytes`.
    pub input_bytes: u64,
    /// Calls per command (`cmdstat_<name>`, lower case, `info` left out).
    pub calls: BTreeMap<String, u64>,
}

/// A connection that reads the counters, and how many commands a reading itself adds to
/// `total_commands_processed` (measured by two readings back to back, so the bench's `INFO` calls are never
/// counted as the coordinator's).
pub struct Probe {
    /// The connection.
    pub conn: MultiplexedConnection,
    overhead: u64,
}

impl Probe {
    /// Calibrates the overhead of a reading on `conn`.
    pub async fn new(mut conn: MultiplexedConnection) -> redis::RedisResult<Probe> {
        let a = read(&mut conn).await?;
        let b = read(&mut conn).await?;
        Ok(Probe {
            overhead: b.commands - a.commands,
            conn,
        })
    }

    /// Reads the counters.
    pub async fn read(&mut self) -> redis::RedisResult<Counters> {
        read(&mut self.conn).await
    }

    /// What happened since `before`, this reading's own commands left out.
    pub async fn since(&mut self, before: &Counters) -> redis::RedisResult<Delta> {
        let now = read(&mut self.conn).await?;
        Ok(now.since(before, self.overhead))
    }
}

/// Reads the counters.
async fn read(conn: &mut MultiplexedConnection) -> redis::RedisResult<Counters> {
    let stats: String = redis::cmd("INFO").arg("stats").query_async(conn).await?;
    let cmdstats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    let field = |name: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let calls = cmdstats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| name != "info")
        .collect();
    Ok(Counters {
        commands: field("total_commands_processed"),
        input_bytes: field("total_net_input_bytes"),
        calls,
    })
}

/// What happened between two readings.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    /// `total_commands_processed`: every command executed, scripts' included, the bench's `INFO` calls left out.
    pub commands: u64,
    /// Bytes Redis received (the bench's `INFO` requests are a few dozen bytes per reading).
    pub input_bytes: u64,
    /// Calls per command, script-internal ones included; only commands that ran.
    pub calls: BTreeMap<String, u64>,
}

impl Delta {
    /// Calls of the scripting commands (`EVAL`, `EVALSHA` and their read-only forms, `FCALL`): what clients sent as
    /// scripts.
    pub fn script_calls(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(n, _)| n.starts_with("eval") || n.starts_with("fcall"))
            .map(|(_, c)| c)
            .sum()
    }

    /// `name=calls` for every command that ran, most called first.
    pub fn breakdown(&self) -> String {
        let mut v: Vec<_> = self.calls.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        v.iter().map(|(n, c)| format!("{n}={c}")).collect::<Vec<_>>().join(" ")
    }
}

impl Counters {
    /// `self - before`, less `overhead` commands (the readings' own `INFO` calls).
    pub fn since(&self, before: &Counters, overhead: u64) -> Delta {
        let calls = self
            .calls
            .iter()
            .filter_map(|(n, &c)| {
                let d = c - before.calls.get(n).copied().unwrap_or(0);
                (d > 0).then(|| (n.clone(), d))
            })
            .collect();
        Delta {
            commands: (self.commands - before.commands).saturating_sub(overhead),
            input_bytes: self.input_bytes - before.input_bytes,
            calls,
        }
    }
}

/// The p50 and p99 of `n` sequential round trips of `cmd` on `conn`, in ms.
pub async fn round_trip_ms(conn: &mut MultiplexedConnection, cmd: &redis::Cmd, n: usize) -> (f64, f64) {
    let mut rtts = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let _: redis::Value = cmd.query_async(conn).await.expect("baseline round trip");
        rtts.push(t.elapsed());
    }
    rtts.sort();
    (ms(percentile(&rtts, 0.5)), ms(percentile(&rtts, 0.99)))
}

/// A trivial script's `EVALSHA` (loaded first), the shape of one coordinator section step.
pub async fn evalsha_cmd(conn: &mut MultiplexedConnection) -> redis::Cmd {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return redis.call('TIME')")
        .query_async(conn)
        .await
        .expect("SCRIPT LOAD");
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(0);
    cmd
}

/// The value at quantile `p` of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `MEMORY USAGE` (all samples), `HLEN`, and the longest field's name and length of hash `key`.
pub async fn hash_size(conn: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<(u64, u64, String, u64)> {
    let memory: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await?;
    let fields: Vec<String> = redis::cmd("HKEYS").arg(key).query_async(conn).await?;
    let mut longest = (String::new(), 0u64);
    for f in &fields {
        let len: u64 = redis::cmd("HSTRLEN").arg(key).arg(f).query_async(conn).await?;
        if len > longest.1 {
            longest = (f.clone(), len);
        }
    }
    Ok((memory.unwrap_or(0), fields.len() as u64, longest.0, longest.1))
}
