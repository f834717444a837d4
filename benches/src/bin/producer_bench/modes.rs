//! The modes of a run and the calibration that picks the raw finalists.

use std::sync::Arc;

use anyhow::{ensure, Result};
use protocol::names::StreamName;

use crate::args::{Args, RawShape};
use crate::measure::{clear, load_average, median, rate, total_len};
use crate::raw::{raw_run, Workload};
use crate::server::PrivateRedis;

/// The SDK modes: name on the command line, what it runs.
pub(crate) const SDK_MODES: [(&str, &str); 9] = [
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
pub(crate) enum Mode {
    /// A raw loop finalist.
    Raw(RawShape),
    /// An SDK mode (a name of [`SDK_MODES`]).
    Sdk(&'static str),
    /// `redis-benchmark`, the physical reference.
    RedisBenchmark,
}

impl Mode {
    pub(crate) fn label(&self, args: &Args) -> String {
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
pub(crate) async fn calibrate(
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
pub(crate) const SHAPE_LEGEND: &str = "connections x tasks x depth, g = grouped by shard, r = hand-written RESP";
