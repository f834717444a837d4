//! A mutex this coordinator left behind (a section that failed before its release, or one Redis brought back from
//! its append-only file after a restart) does not block the group for its TTL; a mutex of another coordinator, or
//! of a section still running, is waited for. Group timings must let an assignment lease outlast a dead holder's
//! mutex plus the wait for it.
//!
//! Real time, not paused: these wait on a real Redis, whose client times every reply with a Tokio timer that
//! paused time would fire while the reply is on its way. The wait's backoff and deadline are tested under paused
//! time in `src/section.rs`.

mod common;

use common::*;
use coord_server::server::CoordinatorHandle;
use coord_server::stats::Stats;
use coord_server::store::{LivenessScope, SectionKeys, Store};
use protocol::messages::{CreateGroupRequest, RecreateGroupRequest};
use protocol::metadata::GroupTimings;
use protocol::Status;
use redis::aio::MultiplexedConnection;
use reqwest::StatusCode;
use std::time::Duration;
use test_support::{wait_for, RedisServer};

const S: &str = "orders";
const G: &str = "billing";
const MUTEX_TTL: Duration = Duration::from_secs(2);
const SECTION_TIMEOUT: Duration = Duration::from_millis(1500);

/// Timings whose lease covers [`MUTEX_TTL`] + [`SECTION_TIMEOUT`].
fn timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: 5_000,
        heartbeat_interval_ms: 200,
        rebalance_timeout_ms: 5_000,
        assignment_lease_ms: 4_000,
    }
}

/// A coordinator with the production mutex settings and no tick loop (only the test's requests take the mutex).
async fn coordinator(redis: &RedisServer) -> CoordinatorHandle {
    let mut config = config(&redis.url());
    config.mutex_ttl = MUTEX_TTL;
    config.critical_section_timeout = SECTION_TIMEOUT;
    config.tick_interval = Duration::from_secs(3600);
    config.default_timings = timings();
    CoordinatorHandle::spawn(config).await.expect("coordinator starts")
}

/// The mutex's holder; `None` when it is free (released mutexes are left empty, expired ones are missing).
async fn mutex_holder(conn: &mut MultiplexedConnection) -> Option<String> {
    let holder: Option<String> = redis::cmd("GET").arg(mutex_key(S, G)).query_async(conn).await.unwrap();
    holder.filter(|h| !h.is_empty())
}

fn keys() -> SectionKeys {
    SectionKeys::group(&S.parse().unwrap(), &G.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_mutex_brought_back_by_an_aof_restart_does_not_block_the_group() {
    let mut redis = RedisServer::builder().persistence(true).start().await;
    let coord = coordinator(&redis).await;
    let api = Api::new(coord.url());
    api.create_group_with(S, G, 2, timings()).await;
    let joined = api.hb(S, G, &join("a")).await;
    let a = api.hb(S, G, &follow_up(&joined, &joined.assigned)).await;

    // A section of this coordinator holds the group's mutex when Redis dies; the section fails with the
    // connection (its token is dropped) and the append-only file keeps the mutex.
    let store = coord.coordinator().store();
    let token = store.token();
    store
        .try_load(&keys(), &token, MUTEX_TTL, None, LivenessScope::None)
        .await
        .unwrap()
        .expect("the mutex is free");
    redis.kill();
    drop(token);
    redis.restart().await;
    let mut conn = redis.connection().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(mutex_key(S, G))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 1_000, "the restart brought the mutex back ({pttl} ms left)");

    // The member's next heartbeat (retried only while the coordinator reconnects) is answered at once.
    let stats = coord.coordinator().stats();
    let req = follow_up(&a, &a.assigned);
    let r = wait_for(Duration::from_secs(10), "a heartbeat after the restart", || {
        let (api, req) = (api.clone(), req.clone());
        async move {
            match api.heartbeat(S, G, &req).await {
                Ok(r) => Some(r),
                Err((_, body)) if body.status == Status::StoreUnavailable && !body.message.contains("mutex") => None,
                Err(other) => panic!("refused after the restart: {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(r.assigned, a.assigned, "a keeps its shards");
    assert_eq!(
        Stats::get(&stats.mutex_busy),
        0,
        "no section waited for the stale mutex"
    );
    assert_eq!(Stats::get(&stats.mutex_timeouts), 0);
    assert_eq!(mutex_holder(&mut conn).await, None, "the stale mutex is gone");
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_of_another_coordinator_is_waited_for_not_deleted() {
    let redis = RedisServer::start().await;
    let coord = coordinator(&redis).await;
    let api = Api::new(coord.url());
    api.create_group_with(S, G, 2, timings()).await;
    // Another coordinator (its own store, its own token prefix) holds the mutex: it may be running a section.
    let other = Store::new(redis.connection_manager().await);
    let token = other.token();
    other
        .try_load(&keys(), &token, Duration::from_secs(10), None, LivenessScope::None)
        .await
        .unwrap()
        .expect("the mutex is free");
    let (http, body) = api.heartbeat(S, G, &join("a")).await.expect_err("the mutex is busy");
    assert_eq!(
        (http, body.status),
        (StatusCode::SERVICE_UNAVAILABLE, Status::StoreUnavailable)
    );
    let mut conn = redis.connection().await;
    assert_eq!(
        mutex_holder(&mut conn).await.as_deref(),
        Some(&*token),
        "still the other's"
    );
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_section_of_this_coordinator_keeps_its_mutex() {
    let redis = RedisServer::start().await;
    let coord = coordinator(&redis).await;
    let api = Api::new(coord.url());
    api.create_group_with(S, G, 2, timings()).await;
    // A section of this coordinator that is still running (its token is alive, e.g. a routing section or a slow
    // commit) is never mistaken for a leftover.
    let store = coord.coordinator().store();
    let token = store.token();
    store
        .try_load(&keys(), &token, Duration::from_secs(10), None, LivenessScope::None)
        .await
        .unwrap()
        .expect("the mutex is free");
    let (http, body) = api.heartbeat(S, G, &join("a")).await.expect_err("the mutex is busy");
    assert_eq!(
        (http, body.status),
        (StatusCode::SERVICE_UNAVAILABLE, Status::StoreUnavailable)
    );
    let mut conn = redis.connection().await;
    assert_eq!(mutex_holder(&mut conn).await.as_deref(), Some(&*token));
    // Once the section is over (released or failed), its leftover no longer blocks.
    drop(token);
    let r = api.hb(S, G, &join("a")).await;
    assert_eq!(r.status, Status::Ok);
    coord.shutdown().await;
}

#[tokio::test]
async fn timings_a_dead_holders_mutex_can_outlast_are_refused_over_http() {
    let redis = RedisServer::start().await;
    let coord = coordinator(&redis).await;
    let api = Api::new(coord.url());
    // Valid for the protocol (heartbeat < lease <= TTL), but 2.5 s < 2 s mutex TTL + 1.5 s wait.
    let short = GroupTimings {
        member_ttl_ms: 2_500,
        heartbeat_interval_ms: 200,
        rebalance_timeout_ms: 3_000,
        assignment_lease_ms: 2_500,
    };
    short.validate().expect("valid for the protocol alone");
    let mut conn = redis.connection().await;
    let create = CreateGroupRequest {
        shard_count: Some(2),
        timings: Some(short),
    };
    let body = error_json(
        api.post(&protocol::routes::group(S, G), &create).await,
        StatusCode::BAD_REQUEST,
        Status::InvalidRequest,
    )
    .await;
    assert!(body.message.contains("mutex_ttl"), "{body:?}");
    let recreate = RecreateGroupRequest {
        shard_count: 2,
        timings: Some(short),
        confirm: true,
    };
    let body = error_json(
        api.post(&protocol::routes::recreate(S, G), &recreate).await,
        StatusCode::BAD_REQUEST,
        Status::InvalidRequest,
    )
    .await;
    assert!(body.message.contains("mutex_ttl"), "{body:?}");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
    assert!(keys.is_empty(), "nothing was written: {keys:?}");
    // The same request with a lease that covers them is accepted.
    let create = CreateGroupRequest {
        shard_count: Some(2),
        timings: Some(GroupTimings {
            member_ttl_ms: 3_500,
            assignment_lease_ms: 3_500,
            ..short
        }),
    };
    let resp = api.post(&protocol::routes::group(S, G), &create).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    coord.shutdown().await;
}
