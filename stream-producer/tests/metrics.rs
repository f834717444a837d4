//! The producer's metrics (`metrics` feature), each provoked against a real redis-server and the in-process
//! coordinator, and read back from an in-memory recorder installed as the process's global recorder.
//!
//! Tests of this binary share that recorder (`cargo test` runs them on threads of one process; nextest runs each
//! in its own process). They stay apart by their labels: every test publishes to its own stream.
#![cfg(feature = "metrics")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use client_core::testing::FailingVersionStore;
use common::{any_port, coordinator_config, DEADLINE};
use coord_server::server::CoordinatorHandle;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use stream_producer::metrics::{names, OUTCOME_NOT_WRITTEN, OUTCOME_WRITTEN, REASON_ROUTING_EXPIRED};
use stream_producer::{MemoryVersionStore, Producer, ProducerBuilder, PublishError, VersionStore};
use test_support::metrics::MemoryRecorder;
use test_support::{wait_until, FaultProxy, Mode, RedisServer};

/// The process-global recorder, installed by the first test that asks (before it builds any producer: handles
/// are registered at build time).
fn recorder() -> &'static MemoryRecorder {
    MemoryRecorder::global()
}

/// Redis, a coordinator reached through a fault proxy (so a crash also drops its kept-alive connections), and a
/// stream of its own.
struct Env {
    redis: RedisServer,
    coordinator: Option<CoordinatorHandle>,
    proxy: FaultProxy,
    stream: String,
}

impl Env {
    async fn start(stream: &str, lease: Duration) -> Env {
        let redis = RedisServer::start().await;
        let coordinator = CoordinatorHandle::spawn(coordinator_config(&redis.url(), lease, any_port()))
            .await
            .expect("coordinator starts");
        coordinator
            .coordinator()
            .create_group(
                &StreamName::new(stream).unwrap(),
                &GroupName::new("billing").unwrap(),
                &CreateGroupRequest {
                    shard_count: Some(4),
                    timings: None,
                },
            )
            .await
            .expect("stream routing created");
        let proxy = FaultProxy::start(coordinator.addr()).await;
        Env {
            redis,
            coordinator: Some(coordinator),
            proxy,
            stream: stream.to_owned(),
        }
    }

    fn producer(&self) -> ProducerBuilder {
        Producer::builder(&self.stream)
            .coordinator(format!("http://{}", self.proxy.addr()))
            .redis(self.redis.url())
    }

    /// The coordinator crashes: its process and its connections are gone.
    fn crash_coordinator(&mut self) {
        self.coordinator.take().expect("coordinator running").abort();
        self.proxy.set_mode(Mode::Reset);
    }

    fn stream(&self) -> [(&str, &str); 1] {
        [("stream", &self.stream)]
    }

    fn with<'a>(&'a self, key: &'a str, value: &'a str) -> [(&'a str, &'a str); 2] {
        [("stream", &self.stream), (key, value)]
    }
}

/// Short lease (refresh every 500 ms) so the outage plays out quickly.
const SHORT_LEASE: Duration = Duration::from_millis(1500);

#[tokio::test]
async fn routing_cache_age_grows_and_refresh_failures_are_counted_while_the_coordinator_is_gone() {
    let m = recorder();
    let mut env = Env::start("metrics-outage", SHORT_LEASE).await;
    let producer = env.producer().build().unwrap();
    producer.ready().await.unwrap();
    producer.send("before", &[("f", "v")]).await.unwrap();
    let s = env.stream();
    assert_eq!(m.counter(names::RECORDS, &env.with("outcome", OUTCOME_WRITTEN)), 1);
    assert!(m.counter(names::ROUTING_REFRESHES, &s) >= 1);
    assert_eq!(m.counter(names::ROUTING_REFRESH_FAILURES, &s), 0);
    assert_eq!(m.gauge(names::ROUTING_VERSION, &s), 1.0);
    let lease = m.gauge(names::ROUTING_LEASE_REMAINING, &s);
    assert!(lease > 0.0 && lease <= SHORT_LEASE.as_secs_f64(), "{lease}");
    assert!(m.gauge(names::ROUTING_CACHE_AGE, &s) < SHORT_LEASE.as_secs_f64());

    env.crash_coordinator();
    let s = env.stream();
    // Nothing is published from here: the background refresher's failing retries keep the gauges current.
    wait_until(DEADLINE, "a refresh failure counted", || {
        let failures = m.counter(names::ROUTING_REFRESH_FAILURES, &s);
        async move { failures >= 1 }
    })
    .await;
    let mut ages = Vec::new();
    wait_until(DEADLINE, "the routing lease gauge at 0", || {
        ages.push(m.gauge(names::ROUTING_CACHE_AGE, &s));
        let lease = m.gauge(names::ROUTING_LEASE_REMAINING, &s);
        async move { lease == 0.0 }
    })
    .await;
    // The age keeps growing past the lease while refreshes keep failing.
    wait_until(DEADLINE, "the cache age past the lease", || {
        let age = m.gauge(names::ROUTING_CACHE_AGE, &s);
        ages.push(age);
        async move { age > SHORT_LEASE.as_secs_f64() }
    })
    .await;
    println!("routing cache age samples during the outage: {ages:?}");
    assert!(
        ages.windows(2).all(|w| w[1] >= w[0]),
        "the age never went down: {ages:?}"
    );
    assert!(ages.last() > ages.first(), "the age grew: {ages:?}");
    let failures = m.counter(names::ROUTING_REFRESH_FAILURES, &s);
    assert!(failures >= 2, "retries with backoff: {failures}");
    assert!(failures <= producer.stats().refresh_failures);

    // A publish now fails closed, and says why.
    let err = producer.send("after", &[("f", "v")]).await.unwrap_err();
    assert!(matches!(err, PublishError::RoutingExpired { .. }), "{err:?}");
    assert_eq!(
        m.counter(names::PUBLISH_FAILURES, &env.with("reason", REASON_ROUTING_EXPIRED)),
        1
    );
    assert_eq!(m.counter(names::RECORDS, &env.with("outcome", OUTCOME_NOT_WRITTEN)), 1);
    assert_eq!(m.gauge(names::ROUTING_LEASE_REMAINING, &s), 0.0);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_publish_updates_the_routing_gauges_without_a_refresh() {
    let m = recorder();
    // A long lease: no periodic refresh (10 s) during the test.
    let env = Env::start("metrics-publish", Duration::from_secs(30)).await;
    let producer = env.producer().build().unwrap();
    producer.ready().await.unwrap();
    let s = env.stream();
    let refreshes = m.counter(names::ROUTING_REFRESHES, &s);
    let age_at_refresh = m.gauge(names::ROUTING_CACHE_AGE, &s);
    wait_until(DEADLINE, "the routing to be 300 ms old", || {
        let old = producer.routing().is_some_and(|r| r.age >= Duration::from_millis(300));
        async move { old }
    })
    .await;
    assert_eq!(
        m.gauge(names::ROUTING_CACHE_AGE, &s),
        age_at_refresh,
        "nothing updated it yet"
    );
    producer.send("k", &[("f", "v")]).await.unwrap();
    let age = m.gauge(names::ROUTING_CACHE_AGE, &s);
    let lease = m.gauge(names::ROUTING_LEASE_REMAINING, &s);
    assert!(age >= 0.3, "the publish set the age: {age}");
    assert!(lease > 0.0 && lease <= 30.0 - 0.3, "and the lease: {lease}");
    assert_eq!(m.counter(names::ROUTING_REFRESHES, &s), refreshes, "without a refresh");
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_routing_rollback_is_counted() {
    let m = recorder();
    let env = Env::start("metrics-rollback", SHORT_LEASE).await;
    // This producer's version store remembers a routing version no lost history can hold (far beyond Redis time:
    // a damaged store); Redis stores version 1. The coordinator does not restore to it and answers the stored
    // routing, which the producer adopts and counts.
    let store = MemoryVersionStore::new();
    store.store(&env.stream, 1 << 52).await.unwrap();
    let producer = env.producer().version_store(store).build().unwrap();
    producer.ready().await.unwrap();
    let s = env.stream();
    assert_eq!(m.counter(names::ROUTING_ROLLBACKS, &s), 1);
    assert_eq!(
        m.gauge(names::ROUTING_VERSION, &s),
        1.0,
        "the stored routing is adopted"
    );
    assert_eq!(producer.stats().routing_rollbacks, 1);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_failing_version_store_is_retried_counted_and_shown_until_it_persists() {
    let m = recorder();
    // A long lease: the routing version never grows again during the test, so only a retry can persist it.
    let env = Env::start("metrics-store", Duration::from_secs(30)).await;
    let store = FailingVersionStore::default();
    store.set_failing(true);
    let producer = env.producer().version_store(store.clone()).build().unwrap();
    producer.ready().await.unwrap();
    let s = env.stream();
    wait_until(DEADLINE, "two failed attempts to persist routing version 1", || {
        let failures = m.counter(names::VERSION_STORE_FAILURES, &s);
        async move { failures >= 2 }
    })
    .await;
    assert_eq!(m.gauge(names::VERSION_UNPERSISTED, &s), 1.0);
    assert!(producer.stats().version_store_failures >= 2);
    // The producer keeps working within its lease meanwhile.
    producer.send("k", &[("f", "v")]).await.unwrap();

    store.set_failing(false);
    wait_until(DEADLINE, "the version persisted by a retry", || {
        let store = store.clone();
        let stream = env.stream.clone();
        async move { store.stored(&stream).await == 1 }
    })
    .await;
    wait_until(DEADLINE, "the unpersisted gauge back at 0", || {
        let g = m.gauge(names::VERSION_UNPERSISTED, &s);
        async move { g == 0.0 }
    })
    .await;
    assert_eq!(
        m.counter(names::VERSION_STORE_FAILURES, &s),
        store.failed_writes(),
        "every failed write is counted"
    );
    producer.close().await.unwrap();
}

#[tokio::test]
async fn every_name_is_registered_at_build_with_low_cardinality_labels_and_documented() {
    let m = recorder();
    let env = Env::start("metrics-names", SHORT_LEASE).await;
    let producer = env.producer().build().unwrap();
    let series = m.series_with(&env.stream());
    let registered: BTreeSet<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    let all: BTreeSet<&str> = names::ALL.into_iter().collect();
    assert_eq!(registered, all, "every series exists from the build, at 0");
    let mut labelled: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (name, labels) in &series {
        let extra: Vec<(&str, &str)> = labels
            .iter()
            .filter(|(k, _)| k.as_str() != "stream")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match name.as_str() {
            names::PUBLISH_FAILURES | names::RECORDS => {
                assert_eq!(extra.len(), 1, "{name}: {labels:?}");
                labelled.entry(name.as_str()).or_default().insert(extra[0].1);
            }
            _ => assert!(extra.is_empty(), "{name}: {labels:?}"),
        }
    }
    assert_eq!(
        labelled[names::PUBLISH_FAILURES],
        BTreeSet::from(["no_routing", "routing_expired"])
    );
    assert_eq!(
        labelled[names::RECORDS],
        BTreeSet::from(["not_written", "unknown", "written"])
    );
    producer.close().await.unwrap();

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
        .filter(|w| w.starts_with("redis_stream_producer_"))
        .collect();
    assert_eq!(
        documented, all,
        "docs/metrics.md \"Client metrics\" lists the producer's names"
    );
}
