//! `GET /metrics` against a real Redis: every signal of the failure-handling design is provoked here and read back
//! from the Prometheus text the coordinator serves (see `docs/metrics.md` for the list and which test covers it).

mod common;

use common::*;
use coord_server::metrics::names;
use coord_server::server::CoordinatorHandle;
use protocol::messages::{AddShardsRequest, ErrorResponse};
use protocol::{MemberEpoch, MetadataVersion, Status};
use reqwest::header::IF_MATCH;
use reqwest::StatusCode;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use test_support::{wait_for, wait_until, RedisServer};

const S: &str = "orders";
const G: &str = "billing";
const HB: &str = "/v1/streams/orders/groups/billing/heartbeat";
const WAIT: Duration = Duration::from_secs(15);

/// One parsed `/metrics` page.
struct Scrape {
    text: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    fn parse(text: String) -> Scrape {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("`series value` line");
            let value: f64 = value.parse().unwrap_or_else(|e| panic!("bad value in {line:?}: {e}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').expect("closing brace");
                    let labels = body
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once("=\"").expect("label=\"value\"");
                            (k.to_owned(), v.trim_end_matches('"').to_owned())
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
                None => (series.to_owned(), BTreeMap::new()),
            };
            samples.push((name, labels, value));
        }
        Scrape { text, samples }
    }

    /// The value of the one series of `name` carrying every label of `labels` (others may be present too).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, _, v)| *v)
    }

    /// Like [`Scrape::get`], 0 when the series is absent.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// Whether some series of the family `name` exists (histograms count through their `_count` series).
    fn has_family(&self, name: &str) -> bool {
        self.samples.iter().any(|(n, _, _)| {
            n == name
                || n.strip_prefix(name)
                    .is_some_and(|s| ["_count", "_sum", "_bucket"].contains(&s))
        })
    }
}

async fn scrape(url: &str) -> Scrape {
    let resp = reqwest::get(format!("{url}/metrics")).await.expect("GET /metrics");
    assert_eq!(resp.status(), StatusCode::OK);
    let content_type = resp.headers()[reqwest::header::CONTENT_TYPE]
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    Scrape::parse(resp.text().await.expect("body"))
}

/// Waits until the scrape's `name{labels}` satisfies `ok`, and returns that scrape.
async fn wait_metric(url: &str, name: &str, labels: &[(&str, &str)], ok: impl Fn(f64) -> bool) -> Scrape {
    let what = format!("{name}{labels:?}");
    wait_for(WAIT, &what, || async {
        let s = scrape(url).await;
        s.get(name, labels).filter(|v| ok(*v)).map(|_| s)
    })
    .await
}

const GROUP: [(&str, &str); 2] = [("stream", S), ("group", G)];

#[tokio::test]
async fn heartbeat_answers_are_counted_by_status() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let a1 = api.hb(S, G, &join("a")).await;
    api.hb(S, G, &follow_up(&a1, &[])).await;

    let mut stale = follow_up(&a1, &[]);
    stale.member_epoch = MemberEpoch(a1.member_epoch.0 + 10);
    error_json(
        api.post(HB, &stale).await,
        StatusCode::CONFLICT,
        Status::FencedMemberEpoch,
    )
    .await;
    let mut ghost = join("ghost");
    ghost.member_epoch = MemberEpoch(3);
    error_json(api.post(HB, &ghost).await, StatusCode::CONFLICT, Status::UnknownMember).await;
    let mut ahead = follow_up(&a1, &[]);
    ahead.metadata_version = MetadataVersion(a1.metadata_version.0 + 100);
    ahead.max_observed_version = ahead.metadata_version;
    assert_eq!(api.hb(S, G, &ahead).await.status, Status::SyncMetadata);

    let m = scrape(&coord.url()).await;
    let by = |s: &str| m.value(names::HEARTBEATS, &[("status", s)]);
    assert!(by("OK") >= 2.0, "{}", m.text);
    assert_eq!(by("FENCED_MEMBER_EPOCH"), 1.0, "{}", m.text);
    assert_eq!(by("UNKNOWN_MEMBER"), 1.0, "{}", m.text);
    assert_eq!(by("SYNC_METADATA"), 1.0, "{}", m.text);
    assert_eq!(
        by("COORDINATOR_TERMINATING"),
        0.0,
        "every status is exported from the start"
    );
    // Every answer is timed once, whatever its status.
    let timed = |suffix: &str| m.value(&format!("{}_{suffix}", names::HEARTBEAT_DURATION), &[]);
    assert_eq!(timed("count"), by("OK") + 3.0, "{}", m.text);
    assert!(timed("sum") > 0.0 && timed("sum") < timed("count") * 5.0, "{}", m.text);
    let within = m.value(&format!("{}_bucket", names::HEARTBEAT_DURATION), &[("le", "2.5")]);
    assert_eq!(within, timed("count"), "test answers take well under 2.5 s: {}", m.text);

    coord.begin_shutdown();
    error_json(
        api.post(HB, &follow_up(&a1, &[])).await,
        StatusCode::SERVICE_UNAVAILABLE,
        Status::CoordinatorTerminating,
    )
    .await;
    let m = scrape(&coord.url()).await;
    assert_eq!(
        m.value(names::HEARTBEATS, &[("status", "COORDINATOR_TERMINATING")]),
        1.0
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn terminating_gauge_follows_the_shutdown_gate() {
    let (_redis, coord) = start().await;
    let m = scrape(&coord.url()).await;
    assert_eq!(m.get(names::TERMINATING, &[]), Some(0.0), "{}", m.text);
    assert_eq!(m.get(names::SECTIONS_IN_FLIGHT, &[]), Some(0.0));
    coord.begin_shutdown();
    let m = scrape(&coord.url()).await;
    assert_eq!(m.get(names::TERMINATING, &[]), Some(1.0), "{}", m.text);
    coord.shutdown().await;
}

// Real time: the section waits on a real Redis (see `stale_mutex.rs`; the wait itself is tested under paused time
// in `src/section.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_latency_busy_and_timeouts_are_measured() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let a1 = api.hb(S, G, &join("a")).await;
    let m = scrape(&coord.url()).await;
    assert!(
        m.value(&format!("{}_count", names::MUTEX_WAIT), &[]) >= 2.0,
        "{}",
        m.text
    );
    assert!(
        m.text
            .contains(&format!("{}_bucket{{le=\"0.001\"}}", names::MUTEX_WAIT)),
        "{}",
        m.text
    );

    // Another holder keeps the mutex past the critical-section deadline (1.5 s): busy, then a timeout.
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("SET")
        .arg(mutex_key(S, G))
        .arg("someone-else")
        .arg("PX")
        .arg(5_000)
        .query_async(&mut conn)
        .await
        .expect("SET mutex");
    let (status, body) = api
        .heartbeat(S, G, &follow_up(&a1, &[]))
        .await
        .expect_err("the mutex is held");
    assert_eq!(
        (status, body.status),
        (StatusCode::SERVICE_UNAVAILABLE, Status::StoreUnavailable)
    );
    let m = scrape(&coord.url()).await;
    assert!(m.value(names::MUTEX_BUSY, &[]) >= 1.0, "{}", m.text);
    assert_eq!(m.value(names::MUTEX_TIMEOUTS, &[]), 1.0, "{}", m.text);
    assert_eq!(m.value(names::HEARTBEATS, &[("status", "STORE_UNAVAILABLE")]), 1.0);
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_conflicts_are_counted_for_the_store_and_for_if_match() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    let created = api.create_group(S, G, 2).await;
    let a1 = api.hb(S, G, &join("a")).await;

    // An admin mutation with a stale If-Match.
    let resp = api
        .request(
            reqwest::Method::POST,
            "/v1/streams/orders/groups/billing/members/a/fence",
        )
        .header(IF_MATCH, format!("\"{}\"", created.revision.0 + 100))
        .send()
        .await
        .expect("request sent");
    error_json(resp, StatusCode::PRECONDITION_FAILED, Status::RevisionConflict).await;
    let stale_shards = api
        .request(reqwest::Method::POST, "/v1/streams/orders/shards")
        .header(IF_MATCH, "\"999\"")
        .json(&AddShardsRequest { count: 1 })
        .send()
        .await
        .expect("request sent");
    error_json(stale_shards, StatusCode::PRECONDITION_FAILED, Status::RevisionConflict).await;
    let m = scrape(&coord.url()).await;
    assert_eq!(m.value(names::ADMIN_REVISION_CONFLICTS, &[]), 2.0, "{}", m.text);

    // A foreign writer that ignores the mutex bumps the revision between load and compare-and-set.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let mut conn = redis.connection().await;
        let key = metadata_key(S, G);
        tokio::spawn(async move {
            // A commit that changed nothing, as the group's scripts would record it: the revision and its (empty)
            // log entry. The revision alone would be a cut change, refused as unreadable rather than retried.
            let bump = redis::Script::new(
                "local r = redis.call('HINCRBY', KEYS[1], 'revision', 1) \
                 redis.call('HSET', KEYS[1], 'log:' .. r, '') return r",
            );
            while !stop.load(Ordering::Relaxed) {
                let _: Result<i64, _> = bump.key(&key).invoke_async(&mut conn).await;
            }
        })
    };
    wait_until(WAIT, "a revision conflict", || {
        let api = api.clone();
        let req = follow_up(&a1, &[]);
        async move {
            // Answered OK or, after every retry lost, STORE_UNAVAILABLE: either way the conflicts are counted.
            let _ = api.heartbeat(S, G, &req).await;
            scrape(&api.base).await.value(names::REVISION_CONFLICTS, &[]) >= 1.0
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer task");
    coord.shutdown().await;
}

#[tokio::test]
async fn member_heartbeat_age_grows_and_an_expiry_is_counted() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    api.hb(S, G, &join("a")).await;
    let m = wait_metric(&coord.url(), names::MEMBERS, &GROUP, |v| v == 1.0).await;
    assert_eq!(
        m.get(names::MEMBERS_EXPIRED, &GROUP),
        Some(0.0),
        "counters exist before the first event"
    );
    // Silence: the age of the last renewal grows with Redis time ...
    wait_metric(&coord.url(), names::HEARTBEAT_AGE_MAX, &GROUP, |v| v >= 0.5).await;
    // ... until the lease (2 s) ends and the tick expires the member.
    let m = wait_metric(&coord.url(), names::MEMBERS_EXPIRED, &GROUP, |v| v == 1.0).await;
    assert!(m.get(names::HEARTBEAT_AGE_MEDIAN, &GROUP).is_some());
    wait_metric(&coord.url(), names::MEMBERS, &GROUP, |v| v == 0.0).await;
    let m = scrape(&coord.url()).await;
    assert!(
        m.value(
            names::GROUP_EVENTS,
            &[("stream", S), ("group", G), ("event", "member_expired")]
        ) >= 1.0,
        "{}",
        m.text
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn a_drain_that_does_not_progress_shows_in_the_revoke_gauges() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 4).await;
    let a1 = api.hb(S, G, &join("a")).await;
    assert_eq!(a1.assigned.len(), 4, "a lone member gets every shard: {a1:?}");
    let reading = reading_after(&a1, &[]);
    api.hb(S, G, &join("b")).await;
    // a keeps heartbeating, still reading everything, and never reports REVOKED.
    let (last_a, m) = wait_for(WAIT, "a drain older than 0.3 s", || {
        let api = api.clone();
        let mut req = follow_up(&a1, &reading);
        req.revoking.clear();
        let url = coord.url();
        async move {
            let resp = api.hb(S, G, &req).await;
            let m = scrape(&url).await;
            let ok = m.value(names::SHARDS_REVOKING, &GROUP) >= 1.0 && m.value(names::REVOKE_AGE_MAX, &GROUP) >= 0.3;
            ok.then_some((resp, m))
        }
    })
    .await;
    assert!(!last_a.revoke.is_empty(), "{last_a:?}");
    assert_eq!(m.value(names::SHARDS_REVOKING, &GROUP), 2.0, "{}", m.text);
    assert_eq!(
        m.value(names::SHARDS_UNOWNED, &GROUP),
        0.0,
        "b's shards are still owned by a"
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn fencing_is_counted_and_shown() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    api.hb(S, G, &join("a")).await;
    let resp = api
        .request(
            reqwest::Method::POST,
            "/v1/streams/orders/groups/billing/members/a/fence",
        )
        .send()
        .await
        .expect("request sent");
    assert_eq!(resp.status(), StatusCode::OK);
    let m = wait_metric(&coord.url(), names::FENCED_MEMBERS, &GROUP, |v| v == 1.0).await;
    assert_eq!(m.value(names::MEMBERS_FENCED, &GROUP), 1.0, "{}", m.text);
    coord.shutdown().await;
}

#[tokio::test]
async fn a_rollback_counts_regressions_client_versions_ahead_and_opens_a_round() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 4).await;
    let a1 = api.hb(S, G, &join("a")).await;
    let snapshot = redis.snapshot_keys(&format!("redis-stream:coord:{{{S}:{G}}}:*")).await;
    api.hb(S, G, &join("b")).await;
    let a2 = api.hb(S, G, &follow_up(&a1, &a1.assigned)).await;
    assert!(a2.metadata_version > a1.metadata_version);
    redis.restore_snapshot(&snapshot).await;

    let sync = api.hb(S, G, &follow_up(&a2, &reading_after(&a2, &a1.assigned))).await;
    assert_eq!(sync.status, Status::SyncMetadata);
    let m = wait_metric(&coord.url(), names::CORRECTION_OPEN, &GROUP, |v| v == 1.0).await;
    assert!(m.value(names::CLIENT_VERSION_AHEAD, &GROUP) >= 1.0, "{}", m.text);
    assert!(m.value(names::METADATA_REGRESSIONS, &[]) >= 1.0, "{}", m.text);
    assert!(m.value(names::CORRECTIONS_OPENED, &GROUP) >= 1.0, "{}", m.text);
    assert!(m.value(names::HEARTBEATS, &[("status", "SYNC_METADATA")]) >= 1.0);
    assert_eq!(m.value(names::METADATA_VERSION, &GROUP), a1.metadata_version.0 as f64);
    assert!(m.get(names::CORRECTION_AGE, &GROUP).is_some());

    // A producer that saw a newer routing than Redis stores, while the routing's Redis never changed (the rollback
    // above was of the group's keys): not evidence of a loss (a hostile or damaged client would grow the stream),
    // only counted; the producer gets the stored routing.
    let resp = api
        .get("/v1/streams/orders/routing?routingVersion=1&maxObservedVersion=50")
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let answer: protocol::messages::RoutingResponse = resp.json().await.unwrap();
    assert_eq!(answer.status, Status::SyncMetadata);
    assert_eq!(answer.routing_version, protocol::RoutingVersion(1));
    let m = scrape(&coord.url()).await;
    assert_eq!(m.value(names::ROUTING_VERSION_AHEAD, &[]), 1.0, "{}", m.text);
    assert_eq!(
        m.value(names::ROUTING_RESTORED, &[("why", "reported")]),
        0.0,
        "{}",
        m.text
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn a_deleted_metadata_key_counts_metadata_unavailable() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let a1 = api.hb(S, G, &join("a")).await;
    let mut conn = redis.connection().await;
    let _: i64 = redis::cmd("DEL")
        .arg(metadata_key(S, G))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    error_json(
        api.post(HB, &follow_up(&a1, &[])).await,
        StatusCode::SERVICE_UNAVAILABLE,
        Status::MetadataUnavailable,
    )
    .await;
    let m = scrape(&coord.url()).await;
    assert!(m.value(names::METADATA_UNAVAILABLE, &[]) >= 1.0, "{}", m.text);
    assert_eq!(m.value(names::HEARTBEATS, &[("status", "METADATA_UNAVAILABLE")]), 1.0);
    assert_eq!(
        m.value(names::METADATA_SCHEMA_ERRORS, &[("kind", "decode")]),
        0.0,
        "a missing key is not a schema error"
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn unreadable_metadata_counts_schema_and_layout_errors_by_kind() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let mut conn = redis.connection().await;
    let key = metadata_key(S, G);
    let describe = "/v1/streams/orders/groups/billing";
    for (field, value, kind) in [
        ("group", "{", "decode"),
        ("schemaVersion", "99", "schema"),
        ("layoutVersion", "99", "layout"),
    ] {
        let original: String = redis::cmd("HGET")
            .arg(&key)
            .arg(field)
            .query_async(&mut conn)
            .await
            .expect("HGET");
        let _: i64 = redis::cmd("HSET")
            .arg(&key)
            .arg(field)
            .arg(value)
            .query_async(&mut conn)
            .await
            .expect("HSET");
        let body: ErrorResponse = error_json(
            api.get(describe).await,
            StatusCode::SERVICE_UNAVAILABLE,
            Status::MetadataUnavailable,
        )
        .await;
        let m = scrape(&coord.url()).await;
        assert!(
            m.value(names::METADATA_SCHEMA_ERRORS, &[("kind", kind)]) >= 1.0,
            "{field}={value} ({}): {}",
            body.message,
            m.text
        );
        let _: i64 = redis::cmd("HSET")
            .arg(&key)
            .arg(field)
            .arg(original)
            .query_async(&mut conn)
            .await
            .expect("HSET");
    }
    api.describe(S, G).await;
    coord.shutdown().await;
}

#[tokio::test]
async fn redis_compatibility_failures_are_counted_at_startup_and_at_runtime() {
    let before = coord_server::metrics::startup_compatibility_failures();
    let old = RedisServer::builder().rename_command("XAUTOCLAIM", "").start().await;
    CoordinatorHandle::spawn(config(&old.url()))
        .await
        .expect_err("a Redis without XAUTOCLAIM is refused");
    assert!(coord_server::metrics::startup_compatibility_failures() > before);

    // At runtime: an ACL that refuses a command the tick needs (NOPERM).
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("limited")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("+@all")
        .arg("-smembers")
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://limited:pw@127.0.0.1:{}", redis.port());
    let coord = CoordinatorHandle::spawn(config(&url)).await.expect("start-up passes");
    let m = wait_metric(
        &coord.url(),
        names::COMPATIBILITY_FAILURES,
        &[("phase", "runtime")],
        |v| v >= 1.0,
    )
    .await;
    assert!(
        m.value(names::COMPATIBILITY_FAILURES, &[("phase", "startup")]) >= 1.0,
        "the process-wide start-up count is rendered by every coordinator: {}",
        m.text
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn a_redis_restart_is_counted() {
    let mut redis = RedisServer::start().await;
    let coord = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect("coordinator starts");
    assert_eq!(scrape(&coord.url()).await.value(names::REDIS_RESTARTS, &[]), 0.0);
    redis.restart().await;
    wait_metric(&coord.url(), names::REDIS_RESTARTS, &[], |v| v >= 1.0).await;
    coord.shutdown().await;
}

#[tokio::test]
async fn shard_lag_and_pending_come_from_xinfo_groups() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let key = protocol::keys::shard_stream(
        &protocol::names::StreamName::new(S).expect("stream name"),
        protocol::ShardId(1),
    );
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&key)
        .arg(G)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("XGROUP CREATE");
    for i in 0..3 {
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("n")
            .arg(i)
            .query_async(&mut conn)
            .await
            .expect("XADD");
    }
    let shard1 = [("stream", S), ("group", G), ("shard", "1")];
    let m = wait_metric(&coord.url(), names::SHARD_LAG, &shard1, |v| v == 3.0).await;
    assert_eq!(m.get(names::SHARD_PENDING, &shard1), Some(0.0));
    assert_eq!(m.get(names::SHARD_LENGTH, &[("stream", S), ("shard", "1")]), Some(3.0));
    assert_eq!(m.get(names::SHARD_LENGTH, &[("stream", S), ("shard", "0")]), Some(0.0));
    assert_eq!(
        m.get(names::SHARD_LAG, &[("stream", S), ("shard", "0")]),
        None,
        "no Redis group on shard 0"
    );

    // One entry delivered, not acknowledged.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(G)
        .arg("c1")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(&key)
        .arg(">")
        .query_async(&mut conn)
        .await
        .expect("XREADGROUP");
    let m = wait_metric(&coord.url(), names::SHARD_PENDING, &shard1, |v| v == 1.0).await;
    assert_eq!(m.get(names::SHARD_LAG, &shard1), Some(2.0));
    assert!(m.get(names::LAG_SCRAPE_DURATION, &[]).is_some());
    assert_eq!(m.value(names::LAG_SCRAPE_ERRORS, &[]), 0.0);
    coord.shutdown().await;
}

#[tokio::test]
async fn two_coordinators_in_one_process_keep_separate_metrics() {
    let redis = RedisServer::start().await;
    let one = CoordinatorHandle::spawn(config(&redis.url())).await.expect("first");
    let two = CoordinatorHandle::spawn(config(&redis.url())).await.expect("second");
    let api = Api::new(one.url());
    api.create_group(S, G, 2).await;
    api.hb(S, G, &join("a")).await;
    let ok = [("status", "OK")];
    assert_eq!(scrape(&one.url()).await.value(names::HEARTBEATS, &ok), 1.0);
    assert_eq!(scrape(&two.url()).await.value(names::HEARTBEATS, &ok), 0.0);
    one.shutdown().await;
    two.shutdown().await;
}

/// Every coordinator name exists in a real scrape; every metric name the alert rules, the runbooks and the metrics
/// page mention is a coordinator name or a documented client (SDK) name.
#[tokio::test]
async fn every_documented_name_is_real() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    api.hb(S, G, &join("a")).await;
    let key = protocol::keys::shard_stream(
        &protocol::names::StreamName::new(S).expect("stream name"),
        protocol::ShardId(0),
    );
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&key)
        .arg(G)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("XGROUP CREATE");
    wait_metric(&coord.url(), names::MEMBERS, &GROUP, |v| v == 1.0).await;
    // A restoration, for the family that counts them: a shard record Redis lost, written again by the tick.
    let stream = protocol::names::StreamName::new(S).expect("stream name");
    let _: i64 = redis::cmd("HDEL")
        .arg(protocol::keys::shard_fence(&stream, protocol::ShardId(1)))
        .arg(protocol::keys::shard_fence_fields::BORN_VERSION)
        .query_async(&mut conn)
        .await
        .expect("HDEL record");
    coord.coordinator().tend_routing(&stream).await.expect("tend routing");
    let m = scrape(&coord.url()).await;
    for name in names::ALL {
        assert!(m.has_family(name), "{name} is missing from a real scrape:\n{}", m.text);
    }

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let metrics_page = std::fs::read_to_string(root.join("docs/metrics.md")).expect("docs/metrics.md");
    let client_section = metrics_page
        .split("## Client metrics")
        .nth(1)
        .expect("docs/metrics.md has a \"## Client metrics\" section");
    let client_names = metric_names(client_section.split("\n## ").next().unwrap_or_default());
    assert!(!client_names.is_empty());
    let mut files = vec![
        root.join("deploy/prometheus/alerts.yaml"),
        root.join("docs/metrics.md"),
        root.join("docs/new-edge-case-checklist.md"),
    ];
    let runbooks: Vec<_> = std::fs::read_dir(root.join("docs/runbooks"))
        .expect("docs/runbooks")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    assert!(runbooks.len() >= 7, "{runbooks:?}");
    files.extend(runbooks);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for name in metric_names(&text) {
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            let coordinator = names::ALL.contains(&base);
            assert!(
                coordinator || client_names.contains(&name),
                "{}: {name} is neither a coordinator metric nor a documented client metric",
                file.display()
            );
        }
    }
    coord.shutdown().await;
}

/// Every `redis_stream_...` metric name in `text` (our metrics share that prefix).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("redis_stream_") {
        let start = i + pos;
        let before_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_')
        {
            end += 1;
        }
        let name = &text[start..end];
        // Crate names (`redis_stream_consumer::...`) are followed by `::`, and regular expressions over names
        // (`redis_stream_coord_shard_(lag|pending)`) by a pattern character; metric names are not.
        let rest = &text[end..];
        let pattern = rest.starts_with("::") || rest.starts_with(['(', '*', '|']);
        if before_ok && !pattern && name.matches('_').count() >= 3 {
            out.insert(name.trim_end_matches('_').to_owned());
        }
        i = end.max(start + 1);
    }
    out
}
