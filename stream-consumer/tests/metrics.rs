//! The consumer's metrics (`metrics` feature), each provoked against a real redis-server and the in-process
//! coordinator, and read back from an in-memory recorder installed as the process's global recorder.
//!
//! Tests of this binary share that recorder (`cargo test` runs them on threads of one process; nextest runs each
//! in its own process). They stay apart by their labels: every test uses its own stream and group.
#![cfg(feature = "metrics")]

mod common;

use client_core::testing::FailingVersionStore;

use common::*;
use std::collections::BTreeSet;
use std::time::Duration;
use stream_consumer::metrics::{heartbeat_statuses, names, UNREACHABLE};
use stream_consumer::Message;
use test_support::metrics::MemoryRecorder;

/// The process-global recorder, installed by the first test that asks (before it builds any consumer: handles
/// are registered at build time).
fn recorder() -> &'static MemoryRecorder {
    MemoryRecorder::global()
}

/// The `stream` and `group` labels of `env`'s group.
struct Labels {
    stream: String,
    group: String,
}

impl Labels {
    fn of(env: &Env) -> Labels {
        Labels {
            stream: env.stream.to_string(),
            group: env.group.to_string(),
        }
    }

    fn group(&self) -> [(&str, &str); 2] {
        [("stream", &self.stream), ("group", &self.group)]
    }

    fn status<'a>(&'a self, status: &'a str) -> [(&'a str, &'a str); 3] {
        [("stream", &self.stream), ("group", &self.group), ("status", status)]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_remaining_counts_down_and_drops_to_zero_when_the_coordinator_is_gone() {
    let m = recorder();
    let mut env = Env::start("metrics-lease").await;
    let l = Labels::of(&env);
    let rec = Recorder::new();
    let a = env.consumer("a", &rec).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;

    let granted = m.gauge(names::ASSIGNMENT_LEASE_REMAINING, &l.group());
    assert!(
        granted > 0.0 && granted <= (LEASE - MARGIN).as_secs_f64(),
        "lease {granted} s, granted at most {:?}",
        LEASE - MARGIN
    );
    assert_eq!(m.gauge(names::READING_SHARDS, &l.group()), 8.0);
    assert_eq!(m.gauge(names::REVOKING_SHARDS, &l.group()), 0.0);
    assert!(m.gauge(names::MAX_OBSERVED_VERSION, &l.group()) >= 1.0);
    assert!(m.counter(names::HEARTBEATS, &l.status("OK")) >= 1);
    assert!(m.counter(names::REBALANCES, &l.group()) >= 1, "the first assignment");
    assert_eq!(m.counter(names::LEASE_EXPIRIES, &l.group()), 0);

    env.abort_coordinator();
    // Every failed retry updates the gauge: it goes down, then to 0 when the lease runs out.
    let mut samples = Vec::new();
    test_support::wait_until(LEASE * 3, "the lease gauge to reach 0", || {
        let v = m.gauge(names::ASSIGNMENT_LEASE_REMAINING, &l.group());
        samples.push(v);
        async move { v == 0.0 }
    })
    .await;
    println!("lease gauge samples during the outage: {samples:?}");
    let positive: Vec<f64> = samples.iter().copied().filter(|v| *v > 0.0).collect();
    assert!(
        positive.windows(2).any(|w| w[1] < w[0]),
        "the gauge went down during the outage before reaching 0: {samples:?}"
    );
    test_support::wait_until(
        Duration::from_secs(5),
        "the expiry counted, every shard revoking",
        || {
            let done = m.counter(names::LEASE_EXPIRIES, &l.group()) == 1
                && m.gauge(names::REVOKING_SHARDS, &l.group()) == 8.0
                && m.gauge(names::READING_SHARDS, &l.group()) == 0.0;
            async move { done }
        },
    )
    .await;
    let status = a.status().heartbeats;
    assert_eq!(status.lease_expiries, 1);
    let failures: Vec<(&str, u64)> = heartbeat_statuses()
        .map(|s| (s, m.counter(names::HEARTBEATS, &l.status(s))))
        .filter(|(s, n)| *n > 0 && !matches!(*s, "OK" | "SYNC_METADATA" | "REVOKE_PENDING"))
        .collect();
    assert!(
        m.counter(names::HEARTBEATS, &l.status(UNREACHABLE)) >= 1,
        "no coordinator listens: {failures:?}"
    );
    // Counted before the status is published, so at least what the status said a moment ago.
    let failed: u64 = failures.iter().map(|(_, n)| n).sum();
    assert!(failed >= status.failed, "{failures:?} vs {status:?}");

    env.restart_coordinator().await;
    wait_status(&a, Duration::from_secs(15), "a reads all 8 again", |s| {
        s.reading.len() == 8
    })
    .await;
    let renewed = m.gauge(names::ASSIGNMENT_LEASE_REMAINING, &l.group());
    assert!(renewed > 0.0, "a new answer grants a new lease: {renewed}");
    assert_eq!(m.gauge(names::REVOKING_SHARDS, &l.group()), 0.0);

    a.close().await.unwrap();
    assert_eq!(
        m.gauge(names::ASSIGNMENT_LEASE_REMAINING, &l.group()),
        0.0,
        "a closed consumer holds no lease"
    );
    assert_eq!(m.gauge(names::READING_SHARDS, &l.group()), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_version_store_is_retried_counted_and_shown_until_it_persists() {
    let m = recorder();
    let env = Env::start("metrics-store").await;
    let l = Labels::of(&env);
    let rec = Recorder::new();
    let store = FailingVersionStore::default();
    store.set_failing(true);
    let a = env
        .consumer("a", &rec)
        .version_store(store.clone())
        .build()
        .unwrap()
        .spawn();
    // The consumer keeps working within its lease while its store cannot persist.
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    let observed = a.status().max_observed_version.0;
    assert!(observed >= 1);
    test_support::wait_until(Duration::from_secs(10), "two failed attempts", || {
        let failures = m.counter(names::VERSION_STORE_FAILURES, &l.group());
        async move { failures >= 2 }
    })
    .await;
    assert_eq!(m.gauge(names::VERSION_UNPERSISTED, &l.group()), 1.0);
    let key = stream_consumer::version_store::version_key(&env.stream, &env.group);
    assert_eq!(store.stored(&key).await, 0);

    // Retried without waiting for the version to grow again: the store takes it once it works.
    store.set_failing(false);
    test_support::wait_until(Duration::from_secs(10), "the version persisted by a retry", || {
        let store = store.clone();
        let key = key.clone();
        async move { store.stored(&key).await >= observed }
    })
    .await;
    test_support::wait_until(Duration::from_secs(10), "the unpersisted gauge back at 0", || {
        let g = m.gauge(names::VERSION_UNPERSISTED, &l.group());
        async move { g == 0.0 }
    })
    .await;
    assert_eq!(
        m.counter(names::VERSION_STORE_FAILURES, &l.group()),
        store.failed_writes()
    );
    a.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_shards_counts_a_drain_held_by_a_slow_handler() {
    let m = recorder();
    let env = Env::start("metrics-drain").await;
    let l = Labels::of(&env);
    let rec = Recorder::new();
    let gate = Gate::open();
    let a = env.consumer_with("a", &rec, gate.clone()).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    let rebalances = m.counter(names::REBALANCES, &l.group());

    // a hangs inside one entry of every shard, so a DRAIN cannot finish.
    gate.set(false);
    for shard in 0..SHARDS {
        env.produce_one(shard, u64::from(shard)).await;
    }
    wait_status(&a, Duration::from_secs(10), "a holds an entry of every shard", |s| {
        s.in_flight.len() == 8
    })
    .await;

    // b records into a no-op recorder: the series are per (stream, group), and only a's values are under test.
    let b = metrics::with_local_recorder(&metrics::NoopRecorder, || env.consumer("b", &rec).build().unwrap()).spawn();
    wait_status(&a, Duration::from_secs(10), "a received DRAIN for 4 shards", |s| {
        s.revoking.len() == 4
    })
    .await;
    assert_eq!(m.gauge(names::REVOKING_SHARDS, &l.group()), 4.0);
    assert_eq!(m.gauge(names::READING_SHARDS, &l.group()), 4.0);
    assert!(
        m.counter(names::REBALANCES, &l.group()) > rebalances,
        "the DRAIN changed a's assignment"
    );
    // It stays there while the handler holds the entries: the drain does not progress. Real time: three heartbeats
    // of the consumer's clock.
    let until = std::time::Instant::now() + HEARTBEAT * 3;
    while std::time::Instant::now() < until {
        assert_eq!(m.gauge(names::REVOKING_SHARDS, &l.group()), 4.0);
        tokio::time::sleep(HEARTBEAT / 4).await;
    }

    gate.set(true);
    test_support::wait_until(Duration::from_secs(10), "the drain finished and was released", || {
        let done =
            m.gauge(names::REVOKING_SHARDS, &l.group()) == 0.0 && m.gauge(names::READING_SHARDS, &l.group()) == 4.0;
        async move { done }
    })
    .await;
    wait_status(&b, Duration::from_secs(10), "b reads the drained shards", |s| {
        s.reading.len() == 4
    })
    .await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handler_errors_dead_letters_and_handled_entries_are_counted() {
    let m = recorder();
    let env = Env::start("metrics-dlq").await;
    let l = Labels::of(&env);
    let c = env
        .builder("a")
        .max_deliveries(3)
        .handler(|msg: Message| async move {
            if msg.get_str("n") == Some("poison") {
                Err(format!("cannot handle {}", msg.id()))
            } else {
                Ok(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    wait_status(&c, Duration::from_secs(10), "reads all 8", |s| s.reading.len() == 8).await;
    let mut con = env.redis.connection().await;
    for n in ["poison", "after"] {
        let _: String = redis::cmd("XADD")
            .arg(env.shard_key(2))
            .arg("*")
            .arg("n")
            .arg(n)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    test_support::wait_until(
        Duration::from_secs(10),
        "the poison entry dead-lettered, the next handled",
        || {
            let done =
                m.counter(names::DEAD_LETTERS, &l.group()) == 1 && m.counter(names::ENTRIES_HANDLED, &l.group()) == 1;
            async move { done }
        },
    )
    .await;
    assert_eq!(
        m.counter(names::HANDLER_ERRORS, &l.group()),
        3,
        "one error per delivery up to max_deliveries"
    );
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fenced_member_counts_the_refusal_and_the_rejoin() {
    let m = recorder();
    let env = Env::start("metrics-fenced").await;
    let l = Labels::of(&env);
    let rec = Recorder::new();
    let a = env.consumer("a", &rec).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    let member = protocol::names::MemberId::new("a").unwrap();
    env.coord()
        .coordinator()
        .fence_member(&env.stream, &env.group, &member, None)
        .await
        .expect("fence a");
    test_support::wait_until(Duration::from_secs(10), "the refusal and the rejoin counted", || {
        let done = m.counter(names::HEARTBEATS, &l.status("FENCED_MEMBER_EPOCH")) >= 1
            && m.counter(names::REJOINS, &l.group()) >= 1;
        async move { done }
    })
    .await;
    wait_status(&a, Duration::from_secs(10), "a reads all 8 again", |s| {
        s.reading.len() == 8
    })
    .await;
    assert_eq!(m.gauge(names::READING_SHARDS, &l.group()), 8.0);
    a.close().await.unwrap();
}

#[tokio::test]
async fn every_name_is_registered_at_build_with_low_cardinality_labels_and_documented() {
    let m = recorder();
    let env = Env::start("metrics-names").await;
    let l = Labels::of(&env);
    let rec = Recorder::new();
    let consumer = env.consumer("a", &rec).build().unwrap();
    let series = m.series_with(&l.group());
    let registered: BTreeSet<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    let all: BTreeSet<&str> = names::ALL.into_iter().collect();
    assert_eq!(registered, all, "every series exists from the build, at 0");
    for (name, labels) in &series {
        let keys: Vec<&str> = labels.keys().map(String::as_str).collect();
        let allowed: &[&str] = if name == names::HEARTBEATS {
            &["group", "status", "stream"]
        } else {
            &["group", "stream"]
        };
        assert_eq!(keys, allowed, "{name}");
    }
    let statuses: BTreeSet<&str> = series
        .iter()
        .filter_map(|(_, labels)| labels.get("status").map(String::as_str))
        .collect();
    assert_eq!(statuses, heartbeat_statuses().collect(), "every status from 0");
    drop(consumer);

    // docs/metrics.md lists exactly these names (the runbooks and alert rules are checked against that page by
    // coord-server's `every_documented_name_is_real`).
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md")).unwrap();
    let section = page
        .split("## Client metrics")
        .nth(1)
        .expect("a \"## Client metrics\" section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let documented: BTreeSet<&str> = section
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("redis_stream_consumer_"))
        .collect();
    assert_eq!(
        documented, all,
        "docs/metrics.md \"Client metrics\" lists the consumer's names"
    );
}
