//! Producer benchmark: the SDK's publish paths against the strongest raw pipelined `XADD` loop this program can
//! find, on the same records, in the same run, against one private `redis-server` this program starts (and
//! kills) itself.
//!
//! ```text
//! cargo run --release -p benches --bin producer_bench -- --records 300000 --rounds 3
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
//! nanoseconds from the scheduler, `benches::cpu`, which covers the in-process coordinator as well, idle during
//! a round; for redis-benchmark the CPU of the child process, in 10 ms ticks) and Redis CPU (`INFO cpu` of the private server), and the process's resident
//! memory (`VmRSS` before the mode, and its peak during the mode from `VmHWM`, reset before the mode through
//! `/proc/self/clear_refs` where the kernel allows it). The load average is printed with every round.
//!
//! `--replica`: a second private `redis-server` replicates the first for the whole run (every mode pays for feeding
//! it; the durable modes wait for it):
//!
//! ```text
//! cargo run --release -p benches --bin producer_bench -- --replica --records 200000 --rounds 3 \
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
//! cargo run --release -p benches --bin producer_bench -- --cluster --records 200000 --rounds 3
//! ```

mod args;
mod cluster;
mod measure;
mod modes;
mod raw;
mod sdk;
mod server;
mod single;

use anyhow::Result;
use clap::Parser;

use crate::args::Args;
use crate::cluster::cluster_main;
use crate::single::single_main;

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.cluster {
        return cluster_main(args).await;
    }
    single_main(args).await
}
