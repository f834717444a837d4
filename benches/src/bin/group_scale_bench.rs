//! Group scale benchmark (issue 34): one group of 10,000 members x 10,000 shards (part A), 10,000 groups of 10
//! members (part B), and the coordinator's resident memory with 100 groups of 65,536 shards (part C). Each figure
//! is one line: part, name, value, unit, target, pass/fail. What each part runs is in `benches::scale`.
//!
//! ```sh
//! cargo build --release -p benches --bin group_scale_bench -p coord-server --bin coord-server
//! target/release/group_scale_bench                                  # full sizes (minutes)
//! target/release/group_scale_bench --members 2000 --shards 2000 --groups 1000   # quick
//! target/release/group_scale_bench --parts c --c-groups 10          # one part, scaled
//! ```
//!
//! Nothing but `redis-server` on `PATH` (and, for part C, the `coord-server` binary next to this one or at
//! `--coord-bin`) is needed: each part starts its own private `redis-server`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use benches::scale::{many_groups, one_group, rss};
use clap::Parser;

/// Flags.
#[derive(Parser, Debug)]
#[command(about = "Group scale benchmark (issue 34): one large group, many small groups, coordinator RSS")]
struct Args {
    /// Parts to run, comma-separated: a, b, c.
    #[arg(long, default_value = "a,b,c")]
    parts: String,
    /// A: members of the group.
    #[arg(long, default_value_t = 10_000)]
    members: usize,
    /// A: shards of its stream.
    #[arg(long, default_value_t = 10_000)]
    shards: u32,
    /// A: seconds every member heartbeats at the default interval (2 s).
    #[arg(long, default_value_t = 20)]
    hb_secs: u64,
    /// A: seconds of leaves and joins (at most half the member TTL, 5 s, so the silent members stay alive).
    #[arg(long, default_value_t = 5)]
    change_secs: u64,
    /// A: members leaving and joining again at once.
    #[arg(long, default_value_t = 8)]
    churners: usize,
    /// A and B: most convergence passes after the join pass.
    #[arg(long, default_value_t = 8)]
    converge_passes: usize,
    /// A and B: callers at once while joining and converging.
    #[arg(long, default_value_t = 128)]
    concurrency: usize,
    /// B: groups (each on a stream of its own).
    #[arg(long, default_value_t = 10_000)]
    groups: usize,
    /// B: members per group.
    #[arg(long, default_value_t = 10)]
    group_members: usize,
    /// B: shards of each group's stream.
    #[arg(long, default_value_t = 10)]
    group_shards: u32,
    /// B: heartbeats/s to offer (sets the heartbeat interval: members / rate, at least 2 s).
    #[arg(long, default_value_t = 2_000.0)]
    b_rate: f64,
    /// B: seconds of each window (idle floor, heartbeating).
    #[arg(long, default_value_t = 20)]
    b_secs: u64,
    /// C: groups on the stream.
    #[arg(long, default_value_t = 100)]
    c_groups: usize,
    /// C: shards of the stream.
    #[arg(long, default_value_t = 65_536)]
    c_shards: u32,
    /// C: members per group.
    #[arg(long, default_value_t = 1)]
    c_members: usize,
    /// C: seconds members heartbeat while the resident set is sampled.
    #[arg(long, default_value_t = 20)]
    c_secs: u64,
    /// C: the coord-server binary (default: next to this one).
    #[arg(long)]
    coord_bin: Option<PathBuf>,
}

fn coord_bin(args: &Args) -> Result<PathBuf> {
    if let Some(p) = &args.coord_bin {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().context("this binary's path")?;
    let p = exe.with_file_name("coord-server");
    if !p.exists() {
        bail!(
            "{} is missing: cargo build --release -p coord-server --bin coord-server, or pass --coord-bin",
            p.display()
        );
    }
    Ok(p)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let parts: Vec<&str> = args.parts.split(',').map(str::trim).collect();
    println!("# Group scale (issue 34)");
    println!(
        "- cores: {}; load average at start: {}; allocator: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        benches::scale::drive::load_average(),
        benches::ALLOCATOR
    );
    println!("- command: {}", std::env::args().collect::<Vec<_>>().join(" "));
    if parts.contains(&"a") {
        one_group::run(&one_group::Sizes {
            members: args.members,
            shards: args.shards,
            concurrency: args.concurrency,
            converge_passes: args.converge_passes,
            heartbeat_window: Duration::from_secs(args.hb_secs),
            change_window: Duration::from_secs(args.change_secs),
            churners: args.churners,
        })
        .await?;
    }
    if parts.contains(&"b") {
        many_groups::run(&many_groups::Sizes {
            groups: args.groups,
            members: args.group_members,
            shards: args.group_shards,
            rate: args.b_rate,
            window: Duration::from_secs(args.b_secs),
            concurrency: args.concurrency,
            converge_passes: args.converge_passes,
        })
        .await?;
    }
    if parts.contains(&"c") {
        rss::run(&rss::Sizes {
            groups: args.c_groups,
            shards: args.c_shards,
            members: args.c_members,
            window: Duration::from_secs(args.c_secs),
            binary: coord_bin(&args)?,
        })
        .await?;
    }
    Ok(())
}
