//! Requests naming groups that do not exist leave no per-group state and no tick work behind (issue 11, item 2):
//! after 25,000 of them, the idle coordinator's Redis command rate and a real member's expiry time are what they
//! were before (both measured in the same test).

mod common;

use common::{join, Api};
use coord_server::server::CoordinatorHandle;
use futures::StreamExt;
use protocol::messages::{GroupDescription, HeartbeatRequest};
use std::time::{Duration, Instant};
use test_support::{wait_for, RedisServer};

const S: &str = "orders";
const G: &str = "billing";

/// How many requests name missing groups (as in the report: 8 s of sending against a release build).
const MISSING_REQUESTS: usize = 25_000;
/// Requests in flight at once.
const CONCURRENCY: usize = 32;
/// Window over which the idle command rate is measured.
const RATE_WINDOW: Duration = Duration::from_secs(3);

async fn commands_processed(redis: &RedisServer) -> u64 {
    let mut conn = redis.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has total_commands_processed")
}

/// Redis commands per second while nobody sends a request (the tick loop's own work).
async fn idle_rate(redis: &RedisServer) -> f64 {
    let before = commands_processed(redis).await;
    let started = Instant::now();
    // Measuring a rate needs a window; no correctness depends on its length.
    tokio::time::sleep(RATE_WINDOW).await;
    let after = commands_processed(redis).await;
    (after - before) as f64 / started.elapsed().as_secs_f64()
}

/// Joins `member`, stops its heartbeats, and returns how long the coordinator took to expire it.
async fn expiry_time(api: &Api, member: &str) -> Duration {
    api.hb(S, G, &join(member)).await;
    let silent_since = Instant::now();
    wait_for(Duration::from_secs(60), "the silent member to expire", || async {
        let d: GroupDescription = api.describe(S, G).await;
        (!d.members.iter().any(|m| m.member_id.as_str() == member)).then(|| silent_since.elapsed())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_missing_groups_leave_no_tick_work_behind() {
    let redis = RedisServer::start().await;
    let mut config = common::config(&redis.url());
    // The default tick, as in the report.
    config.tick_interval = Duration::from_millis(250);
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;

    let rate_before = idle_rate(&redis).await;
    let expiry_before = expiry_time(&api, "before").await;

    let started = Instant::now();
    let refused = futures::stream::iter(0..MISSING_REQUESTS)
        .map(|i| {
            let api = api.clone();
            async move {
                let req: HeartbeatRequest = join(&format!("m{i}"));
                let group = format!("missing-{i}");
                api.heartbeat(S, &group, &req).await.is_err()
            }
        })
        .buffer_unordered(CONCURRENCY)
        .filter(|refused| std::future::ready(*refused))
        .count()
        .await;
    let sending = started.elapsed();
    assert_eq!(refused, MISSING_REQUESTS, "every request to a missing group is refused");

    let rate_after = idle_rate(&redis).await;
    let expiry_after = expiry_time(&api, "after").await;
    println!(
        "idle Redis commands/s: {rate_before:.0} before, {rate_after:.0} after {MISSING_REQUESTS} requests to \
         missing groups (sent in {sending:?}); member expiry: {expiry_before:?} before, {expiry_after:?} after"
    );
    assert!(
        rate_after <= rate_before * 1.5 + 20.0,
        "idle command rate grew from {rate_before:.0}/s to {rate_after:.0}/s"
    );
    assert!(
        expiry_after <= expiry_before + Duration::from_millis(1500),
        "expiry took {expiry_after:?} after the flood, {expiry_before:?} before"
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn a_slot_is_kept_only_for_groups_that_exist() {
    let redis = RedisServer::start().await;
    let mut config = common::config(&redis.url());
    // No tick during the test: the slot of a missing group must go without the tick's eviction.
    config.tick_interval = Duration::from_secs(3600);
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let coordinator = coord.coordinator();
    assert_eq!(coordinator.slot_count(), 0);
    for i in 0..50 {
        let err = api.heartbeat(S, &format!("typo-{i}"), &join("a")).await.unwrap_err();
        assert_eq!(err.0, reqwest::StatusCode::NOT_FOUND, "{err:?}");
    }
    assert_eq!(coordinator.slot_count(), 0, "requests to missing groups leave no slot");
    api.hb(S, G, &join("a")).await;
    assert_eq!(
        coordinator.slot_count(),
        1,
        "the existing group keeps its slot (its cache)"
    );
    let groups = coordinator.groups_to_tick().await.expect("groups to tick");
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(coordinator.evict_idle_slots(), 1, "a group found recently is not idle");
    coord.shutdown().await;
}
