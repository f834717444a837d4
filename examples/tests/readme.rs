//! The READMEs' ```rust blocks, compiled as they are written (by `build.rs`, which only replaces the three
//! addresses they show) and run against a real `redis-server` and two in-process coordinators: the producer
//! snippets publish, the handler consumer and the pull consumer (Ctrl-C ends each, as a user would stop it)
//! acknowledge everything, every entry carries the fields the consumer snippets read, and the README's
//! `[dependencies]` list every crate the snippets use.

use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::{keys, ShardId};
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::AsyncCommands;
use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;
use test_support::{wait_until, RedisServer};

mod readme {
    include!(concat!(env!("OUT_DIR"), "/readme_snippets.rs"));
}

/// The READMEs whose snippets `build.rs` compiles (the same list).
const SOURCES: [&str; 2] = [
    include_str!("../../README.md"),
    include_str!("../../stream-producer/README.md"),
];
/// What the snippets read and write.
const STREAM: &str = "orders";
const SHARDS: u32 = 8;

/// The text of every ```rust block of the READMEs.
fn rust_blocks() -> Vec<String> {
    let mut blocks = Vec::new();
    for text in SOURCES {
        let mut current: Option<String> = None;
        for line in text.lines() {
            match current.as_mut() {
                Some(b) if line.trim_start().starts_with("```") => {
                    blocks.push(std::mem::take(b));
                    current = None;
                }
                Some(b) => {
                    b.push_str(line);
                    b.push('\n');
                }
                None if line.trim_start().starts_with("```rust") => current = Some(String::new()),
                None => {}
            }
        }
    }
    blocks
}

/// The field names the snippets read with `get_str("..")`.
fn fields_read() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for block in rust_blocks() {
        for part in block.split("get_str(\"").skip(1) {
            let name = part.split('"').next().expect("split yields a first part");
            names.insert(name.to_owned());
        }
    }
    names
}

/// The roots of the paths the snippets use (`use stream_consumer::..`, `tokio::spawn`), less the standard library.
fn crates_used() -> BTreeSet<String> {
    let mut roots = BTreeSet::new();
    for block in rust_blocks() {
        let bytes = block.as_bytes();
        for (at, _) in block.match_indices("::") {
            let start = block[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            let ident = &block[start..at];
            let is_root = start < 2 || &bytes[start - 2..start] != b"::";
            if is_root && ident.starts_with(|c: char| c.is_ascii_lowercase()) {
                roots.insert(ident.to_owned());
            }
        }
    }
    for builtin in ["std", "core", "alloc", "self", "crate", "super"] {
        roots.remove(builtin);
    }
    roots
}

/// The `name = ...` lines of the README's first ```toml block (its `[dependencies]`).
fn readme_dependencies() -> Vec<(String, String)> {
    let text = SOURCES[0];
    let start = text.find("```toml").expect("the README has a ```toml block");
    let block = &text[start + "```toml".len()..];
    let block = &block[..block.find("```").expect("the ```toml block is closed")];
    block
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(name, rest)| (name.trim().to_owned(), rest.trim().to_owned()))
        .filter(|(name, _)| !name.starts_with('#') && !name.starts_with('['))
        .collect()
}

#[test]
fn the_readme_dependencies_list_every_crate_the_snippets_use() {
    let deps = readme_dependencies();
    let used = crates_used();
    assert!(
        used.contains("stream_consumer") && used.contains("stream_producer") && used.contains("futures"),
        "the snippets' crates were not found: {used:?}"
    );
    for krate in &used {
        let package = krate.replace('_', "-");
        assert!(
            deps.iter().any(|(name, _)| *name == package),
            "a README snippet uses `{krate}`, which the README's [dependencies] block does not list: {deps:?}"
        );
    }
    let tokio = &deps
        .iter()
        .find(|(name, _)| name == "tokio")
        .expect("tokio is listed")
        .1;
    for feature in ["rt-multi-thread", "macros", "signal"] {
        assert!(
            tokio.contains(feature),
            "tokio needs the feature {feature:?} for the snippets: {tokio}"
        );
    }
}

/// Every shard stream of `STREAM`.
fn shard_keys() -> Vec<String> {
    let stream = StreamName::new(STREAM).expect("a valid stream name");
    (0..SHARDS).map(|s| keys::shard_stream(&stream, ShardId(s))).collect()
}

/// Whether `group` has been delivered every entry of every shard and has acknowledged them all.
async fn all_acknowledged(redis: &RedisServer, group: &str) -> bool {
    let mut con = redis.connection().await;
    for key in shard_keys() {
        let last: StreamRangeReply = con.xrevrange_count(&key, "+", "-", 1).await.expect("XREVRANGE");
        let Some(last) = last.ids.first() else { continue };
        let groups: StreamInfoGroupsReply = match con.xinfo_groups(&key).await {
            Ok(g) => g,
            Err(_) => return false,
        };
        match groups.groups.iter().find(|g| g.name == group) {
            Some(g) if g.pending == 0 && g.last_delivered_id == last.id => {}
            _ => return false,
        }
    }
    true
}

/// Runs `snippet` until `done` holds, then sends this process SIGINT (Ctrl-C) until the snippet returns.
async fn run_until_done_then_ctrl_c<F, D, DF>(name: &str, snippet: F, mut done: D)
where
    F: Future<Output = Result<(), readme::BoxError>>,
    D: FnMut() -> DF,
    DF: Future<Output = bool>,
{
    let interrupt = async {
        wait_until(
            Duration::from_secs(60),
            &format!("the {name} snippet handled everything"),
            &mut done,
        )
        .await;
        // The snippet's own Ctrl-C listener has long been registered: it was spawned before the consumer ran.
        loop {
            let status = std::process::Command::new("kill")
                .args(["-s", "INT", &std::process::id().to_string()])
                .status()
                .expect("kill runs");
            assert!(status.success(), "kill -s INT failed");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let result = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::select! {
            result = snippet => result,
            () = interrupt => unreachable!("the interrupt loop never ends"),
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the {name} snippet did not stop within 120 s"));
    result.unwrap_or_else(|e| panic!("the {name} snippet failed: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_snippets_run_against_redis_and_two_coordinators() {
    // From here on SIGINT is delivered to tokio's listeners instead of ending the process.
    let _sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).expect("SIGINT handler");
    let redis = RedisServer::start().await;
    let coordinator_0 = test_support::coordinator::spawn(&redis.url()).await;
    let coordinator_1 = test_support::coordinator::spawn(&redis.url()).await;
    let stream = StreamName::new(STREAM).expect("a valid stream name");
    for (group, shard_count) in [("billing", Some(SHARDS)), ("audit", None)] {
        coordinator_0
            .coordinator()
            .create_group(
                &stream,
                &GroupName::new(group).expect("a valid group name"),
                &CreateGroupRequest {
                    shard_count,
                    timings: Some(test_support::timings::group_timings()),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("group {group} created: {e}"));
    }
    let (c0, c1, r) = (coordinator_0.url(), coordinator_1.url(), redis.url());

    readme::producer(&c0, &c1, &r)
        .await
        .expect("the README's producer snippet");
    readme::producer_sdk(&c0, &c1, &r)
        .await
        .expect("stream-producer/README.md's snippet");

    let mut con = redis.connection().await;
    let mut entries = 0;
    let read = fields_read();
    assert!(read.contains("amount"), "the consumer snippets read `amount`: {read:?}");
    for key in shard_keys() {
        let range: StreamRangeReply = con.xrange_all(&key).await.expect("XRANGE");
        for entry in range.ids {
            entries += 1;
            for field in &read {
                assert!(
                    entry.map.contains_key(field),
                    "entry {} of {key} lacks the field {field:?} that a consumer snippet reads: {:?}",
                    entry.id,
                    entry.map
                );
            }
        }
    }
    assert!(
        entries > 100,
        "the producer snippets wrote {entries} entries, more than 100 expected"
    );

    run_until_done_then_ctrl_c("consumer", readme::consumer(&c0, &c1, &r), || {
        all_acknowledged(&redis, "billing")
    })
    .await;
    run_until_done_then_ctrl_c("pull", readme::pull(&c0, &c1, &r), || all_acknowledged(&redis, "audit")).await;

    coordinator_1.shutdown().await;
    coordinator_0.shutdown().await;
}
