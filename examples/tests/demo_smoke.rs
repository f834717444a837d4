//! Smoke test of the demo: `demo --short --no-progress` (its own private redis-server from PATH, an in-process
//! coordinator, a crash and a join) must exit 0 and report 0 missing records and 0 order violations; the same with
//! `--cluster` (a private local 3-master Redis Cluster), which also prints the shards' spread over the masters and
//! the slot migration it does while everything runs.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// The summary table's rows: metric -> value (`| metric | value | note |`).
fn summary(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            // ["", metric, value, note, ""]
            (cells.len() == 5).then(|| (cells[1].to_owned(), cells[2].to_owned()))
        })
        .collect()
}

fn number(table: &BTreeMap<String, String>, metric: &str, stdout: &str) -> u64 {
    let value = table
        .get(metric)
        .unwrap_or_else(|| panic!("no {metric:?} row in the summary:\n{stdout}"));
    value
        .parse()
        .unwrap_or_else(|_| panic!("{metric:?} is not a number: {value:?}\n{stdout}"))
}

#[test]
fn short_demo_processes_everything_in_order() {
    short_demo(&[]);
}

#[test]
fn short_demo_on_a_local_cluster_processes_everything_in_order() {
    let stdout = short_demo(&["--cluster"]);
    assert!(
        stdout.contains("Redis Cluster"),
        "the demo says it runs on the cluster:\n{stdout}"
    );
    // Which master serves which shard, before and after the slot migration it does.
    let spreads = stdout
        .matches("shards on the cluster's masters: master 127.0.0.1:")
        .count();
    assert!(
        spreads >= 2,
        "the demo prints the shard spread before and after its migration:\n{stdout}"
    );
    assert!(
        stdout.contains("slot migration: slot ") && stdout.contains(" moved from master 127.0.0.1:"),
        "the demo prints the slot migration it did:\n{stdout}"
    );
    let table = summary(&stdout);
    assert_eq!(
        number(&table, "slot migrations (cluster)", &stdout),
        1,
        "the summary counts the migration:\n{stdout}"
    );
}

/// Runs `demo --short --no-progress <extra>` and checks its summary; answers its stdout.
fn short_demo(extra: &[&str]) -> String {
    let start = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--short", "--no-progress"])
        .args(extra)
        // The demo must start its own redis-server and coordinator, whatever the environment says.
        .env_remove("REDIS_URL")
        .env_remove("COORDINATOR_URL")
        .env("RUST_LOG", "warn")
        .output()
        .expect("the demo binary runs");
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo exited with {}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );
    let table = summary(&stdout);
    assert_eq!(number(&table, "missing", &stdout), 0, "{stdout}");
    assert_eq!(number(&table, "order violations", &stdout), 0, "{stdout}");
    let published = number(&table, "records published (acknowledged)", &stdout);
    assert_eq!(published, 5_000, "--short publishes 5000 records\n{stdout}");
    assert!(number(&table, "records processed", &stdout) >= published, "{stdout}");
    for metric in [
        "rebalance: crash -> all shards moved",
        "rebalance: join -> first shard read",
    ] {
        let value = table.get(metric).map(String::as_str).unwrap_or("");
        assert!(value.ends_with(" s"), "{metric}: {value:?}\n{stdout}");
    }
    assert!(stdout.contains("RESULT: PASS"), "{stdout}");
    assert!(
        elapsed < Duration::from_secs(60),
        "the short demo took {elapsed:?}\n{stdout}"
    );
    stdout.into_owned()
}
