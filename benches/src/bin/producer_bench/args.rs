//! The command line: the options of every mode, and the raw loop's shapes (`--raw-shapes`).

use std::fmt;
use std::str::FromStr;

use anyhow::Result;
use clap::{ArgAction, Parser};

/// One shape of the raw loop: `connections` multiplexed redis-rs connections shared by `tasks` tasks (task `t`
/// uses connection `t % connections`), each task sending pipelines of `depth` `XADD`s and awaiting every reply
/// before its next pipeline; `grouped`: the commands of a pipeline are sorted by shard stream. Written `CxTxD`,
/// `CxTxDg` grouped; `CxCxDr` (grouped too) is the same loop without redis-rs: each task owns a plain TCP
/// socket, encodes the RESP of its pipeline by hand into one reused buffer and counts the replies with a minimal
/// parser (the loop redis-benchmark runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawShape {
    pub(crate) connections: usize,
    pub(crate) tasks: usize,
    pub(crate) depth: usize,
    pub(crate) grouped: bool,
    pub(crate) resp: bool,
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
pub(crate) struct Args {
    /// Records per run.
    #[arg(long, default_value_t = 500_000)]
    pub(crate) records: usize,
    /// Payload size of every record, in bytes.
    #[arg(long, default_value_t = 100)]
    pub(crate) payload_bytes: usize,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) keys: usize,
    /// Shards of the stream.
    #[arg(long, default_value_t = 8)]
    pub(crate) shards: u32,
    /// Raw loop: connections of the redis-benchmark-like shape (one task per connection, ungrouped pipelines of
    /// `--pipeline`), always among the shapes tried unless `--raw-shapes` is given; also redis-benchmark's `-c`.
    #[arg(long, default_value_t = 50)]
    pub(crate) raw_connections: usize,
    /// Raw loop: XADDs per pipeline of the redis-benchmark-like shape; also redis-benchmark's `-P`.
    #[arg(long, default_value_t = 32)]
    pub(crate) pipeline: usize,
    /// Raw loop shapes to try, comma-separated `CONNECTIONSxTASKSxDEPTH`, a trailing `g` groups each pipeline by
    /// shard (e.g. `1x4x256g`), a trailing `r` is the hand-written RESP loop on plain sockets (`2x2x256r`).
    /// Default: the redis-benchmark-like shape, every combination of 1, 2, 4 connections x 4, 8, 16, 32 tasks x
    /// depth 64, 256, 512 grouped, and RESP loops of 1x1x256, 2x2x256, 2x2x512, 4x4x256, 4x4x512, 8x8x256.
    #[arg(long, value_delimiter = ',')]
    pub(crate) raw_shapes: Option<Vec<RawShape>>,
    /// Records of one calibration round of a raw shape (0: no calibration, every shape runs in the main rounds).
    #[arg(long, default_value_t = 60_000)]
    pub(crate) calibration_records: usize,
    /// Interleaved calibration rounds per raw shape.
    #[arg(long, default_value_t = 2)]
    pub(crate) calibration_rounds: usize,
    /// Raw shapes with the best calibration medians that go on to the main rounds (plus the best redis-rs and
    /// the best hand-written RESP shape if not among them); the best median there is the baseline of the ratios.
    #[arg(long, default_value_t = 2)]
    pub(crate) raw_finalists: usize,
    /// SDK: publishing connections (the SDK's default).
    #[arg(long, default_value_t = 8)]
    pub(crate) sdk_connections: usize,
    /// SDK: concurrent caller tasks. 32: the fenced path holds a turn for two round trips (the fence check, then
    /// the writes), so it needs about twice the records in flight of a plain pipeline for the same rate (16 tasks
    /// measured 0.75 to 0.78 of the raw loop, 32 tasks 0.84 to 0.91, BENCHMARKS.md); the raw shapes go to 32
    /// tasks as well.
    #[arg(long, default_value_t = 32)]
    pub(crate) sdk_tasks: usize,
    /// SDK enqueue: concurrent caller tasks, each keeping `--delivery-window` deliveries outstanding (4, the
    /// issue's setup: every caller here is a hot loop, and with 16 or 32 of them the producer's one sending task
    /// waits behind them in tokio's run queue: fenced, 0.71 to 0.77 of the raw loop with 32 callers against 0.79 to
    /// 0.88 with 4, BENCHMARKS.md).
    #[arg(long, default_value_t = 4)]
    pub(crate) enqueue_tasks: usize,
    /// SDK send_batch: records per call.
    #[arg(long, default_value_t = 1024)]
    pub(crate) sdk_batch: usize,
    /// SDK batching mode: max batch size.
    #[arg(long, default_value_t = 1024)]
    pub(crate) max_batch_size: usize,
    /// SDK batching mode: batches written at once (default: the SDK's default).
    #[arg(long)]
    pub(crate) max_in_flight_batches: Option<usize>,
    /// SDK enqueue: deliveries a caller task keeps outstanding before it awaits the oldest.
    #[arg(long, default_value_t = 4096)]
    pub(crate) delivery_window: usize,
    /// Rounds per mode (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Modes to run, comma-separated (raw, sdk-batch, sdk-plain, sdk-idem, sdk-enqueue, sdk-enqueue-idem,
    /// sdk-enqueue-plain, and with `--replica` sdk-durable, sdk-durable-plain, sdk-enqueue-durable); ratios need raw.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raw,sdk-batch,sdk-plain,sdk-idem,sdk-enqueue,sdk-enqueue-idem,sdk-enqueue-plain"
    )]
    pub(crate) modes: Vec<String>,
    /// The redis-server binary.
    #[arg(long, default_value = "redis-server")]
    pub(crate) redis_server: String,
    /// Print, per round, `INFO commandstats` of Redis (usec of `XADD` and `EVALSHA`), reset before every round.
    #[arg(long)]
    pub(crate) commandstats: bool,
    /// Run `redis-benchmark -P <pipeline> -c <raw-connections> -r <shards> XADD` once per round, as the
    /// physical reference (`--redis-benchmark=false` to skip; skipped when `redis-benchmark` is not on `PATH`).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_value_t = true, default_missing_value = "true")]
    pub(crate) redis_benchmark: bool,
    /// Run against a local 3-master Redis Cluster instead (raw-cluster vs the SDK modes, see the module docs).
    #[arg(long)]
    pub(crate) cluster: bool,
    /// Attach a replica (a second private redis-server) to the server for the whole run; the durable modes need it.
    #[arg(long)]
    pub(crate) replica: bool,
    /// Durable modes: replicas that must confirm every write (`Durability::Replicas { min }`).
    #[arg(long, default_value_t = 1)]
    pub(crate) durable_replicas: u32,
    /// Durable modes: how long the master waits for them (`Durability::Replicas { timeout }`), in ms.
    #[arg(long, default_value_t = 1000)]
    pub(crate) durable_timeout_ms: u64,
}

impl Args {
    /// The raw shapes to try, the redis-benchmark-like one first.
    pub(crate) fn shapes(&self) -> Vec<RawShape> {
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
