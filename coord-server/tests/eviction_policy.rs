//! The `maxmemory-policy` precondition (issue 11, item 9): unless Redis runs with `noeviction`, the coordinator is
//! not ready, says so in a metric and a log, and creates no group, unless the operator accepted the policy. The
//! policy is read through `INFO memory`, so it works for a user the ACL denies `CONFIG`.

mod common;

use common::{error_json, Api};
use coord_server::metrics::names::EVICTION_POLICY_UNSAFE;
use coord_server::server::CoordinatorHandle;
use protocol::messages::CreateGroupRequest;
use protocol::Status;
use reqwest::StatusCode;
use std::time::Duration;
use test_support::{wait_until, RedisServer};

const WAIT: Duration = Duration::from_secs(20);
const CREATE: &str = "/v1/streams/orders/groups/billing";

async fn lru_redis() -> RedisServer {
    RedisServer::builder()
        .extra_arg("--maxmemory-policy")
        .extra_arg("allkeys-lru")
        .start()
        .await
}

/// The value of an unlabelled gauge in `/metrics`, if present.
async fn gauge(api: &Api, name: &str) -> Option<f64> {
    let text = api.get("/metrics").await.text().await.expect("metrics body");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

async fn config_set_policy(redis: &RedisServer, policy: &str) {
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
}

fn create() -> CreateGroupRequest {
    CreateGroupRequest {
        shard_count: Some(2),
        timings: None,
    }
}

#[tokio::test]
async fn allkeys_lru_keeps_the_coordinator_unready_and_refuses_creates_even_without_config_rights() {
    let redis = lru_redis().await;
    // The deployment's coordinator user may not run CONFIG: the policy must come from INFO.
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("coord")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-config")
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://coord:secret@127.0.0.1:{}", redis.port());
    let coord = CoordinatorHandle::spawn(common::config(&url))
        .await
        .expect("the coordinator starts (unready)");
    let api = Api::new(coord.url());

    let body = error_json(
        api.get("/readyz").await,
        StatusCode::SERVICE_UNAVAILABLE,
        Status::StoreUnavailable,
    )
    .await;
    assert!(
        body.message.contains("allkeys-lru") && body.message.contains("noeviction"),
        "{body:?}"
    );
    assert_eq!(gauge(&api, EVICTION_POLICY_UNSAFE).await, Some(1.0));
    let refused = error_json(
        api.post(CREATE, &create()).await,
        StatusCode::SERVICE_UNAVAILABLE,
        Status::StoreUnavailable,
    )
    .await;
    assert!(refused.message.contains("maxmemory-policy"), "{refused:?}");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("redis-stream:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!(keys.is_empty(), "nothing created: {keys:?}");

    // Fixed at run time: ready at the next probe, and creates work.
    config_set_policy(&redis, "noeviction").await;
    wait_until(WAIT, "/readyz to turn ready", || async {
        api.get("/readyz").await.status() == StatusCode::OK
    })
    .await;
    assert_eq!(gauge(&api, EVICTION_POLICY_UNSAFE).await, Some(0.0));
    assert_eq!(api.post(CREATE, &create()).await.status(), StatusCode::CREATED);
    coord.shutdown().await;
}

#[tokio::test]
async fn an_accepted_policy_is_ready_but_still_reported() {
    let redis = lru_redis().await;
    let mut config = common::config(&redis.url());
    config.accept_eviction_policy = true;
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    assert_eq!(api.get("/readyz").await.status(), StatusCode::OK);
    assert_eq!(api.post(CREATE, &create()).await.status(), StatusCode::CREATED);
    assert_eq!(
        gauge(&api, EVICTION_POLICY_UNSAFE).await,
        Some(1.0),
        "accepted, not hidden"
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn a_policy_changed_at_run_time_is_noticed_by_the_periodic_check() {
    let redis = RedisServer::start().await;
    let coord = CoordinatorHandle::spawn(common::config(&redis.url()))
        .await
        .expect("coordinator starts");
    let api = Api::new(coord.url());
    assert_eq!(api.get("/readyz").await.status(), StatusCode::OK);
    assert_eq!(gauge(&api, EVICTION_POLICY_UNSAFE).await, Some(0.0));
    config_set_policy(&redis, "volatile-lru").await;
    // No probe: only the tick loop's periodic check can notice it.
    wait_until(WAIT, "the periodic check to report the policy", || async {
        gauge(&api, EVICTION_POLICY_UNSAFE).await == Some(1.0)
    })
    .await;
    assert_eq!(api.get("/readyz").await.status(), StatusCode::SERVICE_UNAVAILABLE);
    coord.shutdown().await;
}

#[tokio::test]
async fn with_a_metadata_redis_of_its_own_both_redis_must_run_noeviction() {
    for lru_on_data in [true, false] {
        let (lru, safe) = (lru_redis().await, RedisServer::start().await);
        let (data, metadata) = if lru_on_data { (&lru, &safe) } else { (&safe, &lru) };
        let mut config = common::config(&data.url());
        config.metadata_redis_url = Some(metadata.url());
        let coord = CoordinatorHandle::spawn(config)
            .await
            .expect("coordinator starts (unready)");
        let api = Api::new(coord.url());
        let body = error_json(
            api.get("/readyz").await,
            StatusCode::SERVICE_UNAVAILABLE,
            Status::StoreUnavailable,
        )
        .await;
        assert!(
            body.message.contains("allkeys-lru"),
            "lru on data: {lru_on_data}: {body:?}"
        );
        config_set_policy(&lru, "noeviction").await;
        wait_until(WAIT, "/readyz to turn ready", || async {
            api.get("/readyz").await.status() == StatusCode::OK
        })
        .await;
        coord.shutdown().await;
    }
}
