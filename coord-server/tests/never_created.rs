//! "Never created" (`404 NOT_FOUND`) versus "lost" (`503 METADATA_UNAVAILABLE` + recreate), told apart by the
//! traces Redis still holds (issue 11, item 7; the rule is in docs/failure-handling.md).

mod common;

use common::{error_json, join, liveness_key, metadata_key, start, Api};
use protocol::keys;
use protocol::names::StreamName;
use protocol::{ShardId, Status};
use reqwest::header::RETRY_AFTER;
use reqwest::StatusCode;
use test_support::RedisServer;

const S: &str = "orders";
const G: &str = "billing";

/// Every request that names a group: heartbeat, describe, fence (both forms).
async fn group_requests(api: &Api, stream: &str, group: &str) -> Vec<(String, reqwest::Response)> {
    let base = protocol::routes::group(stream, group);
    vec![
        (
            "heartbeat".into(),
            api.post(&format!("{base}/heartbeat"), &join("a")).await,
        ),
        ("describe".into(), api.get(&base).await),
        (
            "fence".into(),
            api.post(&format!("{base}/members/a/fence"), &serde_json::json!({}))
                .await,
        ),
        (
            "delete member".into(),
            api.request(reqwest::Method::DELETE, &format!("{base}/members/a"))
                .send()
                .await
                .expect("request sent"),
        ),
    ]
}

async fn assert_never_created(api: &Api, stream: &str, group: &str) {
    for (what, resp) in group_requests(api, stream, group).await {
        assert!(resp.headers().get(RETRY_AFTER).is_none(), "{what}: no Retry-After");
        let body = error_json(resp, StatusCode::NOT_FOUND, Status::NotFound).await;
        assert!(body.retry_after_ms.is_none(), "{what}: {body:?}");
        assert!(
            body.message.contains("never created") && body.message.contains("create it"),
            "{what}: {}",
            body.message
        );
        assert!(!body.message.contains("recreate"), "{what}: {}", body.message);
    }
}

async fn assert_lost(api: &Api, trace: &str) {
    for (what, resp) in group_requests(api, S, G).await {
        assert!(resp.headers().get(RETRY_AFTER).is_some(), "{what}: Retry-After");
        let body = error_json(resp, StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable).await;
        assert!(
            body.message.contains(trace) && body.message.contains("recreate"),
            "{what}: expected the trace {trace:?}: {}",
            body.message
        );
    }
}

async fn del(redis: &RedisServer, key: &str) {
    let mut conn = redis.connection().await;
    let _: i64 = redis::cmd("DEL").arg(key).query_async(&mut conn).await.expect("DEL");
}

async fn unindex(redis: &RedisServer) {
    let mut conn = redis.connection().await;
    let _: i64 = redis::cmd("SREM")
        .arg(keys::groups_index())
        .arg(format!("{S}:{G}"))
        .query_async(&mut conn)
        .await
        .expect("SREM");
}

#[tokio::test]
async fn a_group_that_never_existed_is_404_with_a_hint_to_create_it_and_writes_nothing() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let index_before = redis.snapshot_keys("redis-stream:coord:groups").await;
    // A typo in the group of a live stream, and a stream that does not exist either.
    assert_never_created(&api, S, "biling").await;
    assert_never_created(&api, "nowhere", G).await;
    for pattern in ["*biling*", "*nowhere*"] {
        let left = redis.snapshot_keys(pattern).await;
        assert!(
            left.is_empty(),
            "a refused request leaves no key: {:?}",
            left.keys().collect::<Vec<_>>()
        );
    }
    assert_eq!(index_before, redis.snapshot_keys("redis-stream:coord:groups").await);
    coord.shutdown().await;
}

#[tokio::test]
async fn a_group_whose_metadata_is_lost_is_503_as_long_as_any_trace_remains() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    api.hb(S, G, &join("m")).await;
    let metadata = metadata_key(S, G);
    let liveness = liveness_key(S, G);

    // Metadata gone: the index entry and the liveness hash remain.
    del(&redis, &metadata).await;
    assert_lost(&api, "index").await;
    // Index entry gone too: the liveness hash remains.
    unindex(&redis).await;
    assert_lost(&api, "liveness").await;
    // Liveness gone too: a consumer group on a shard remains (the consumer SDK created it to read).
    del(&redis, &liveness).await;
    let shard = keys::shard_stream(&StreamName::new(S).expect("name"), ShardId(1));
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&shard)
        .arg(G)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("XGROUP CREATE");
    assert_lost(&api, "consumer group on shard 1").await;
    // Consumer group gone: a damaged hash (fields, no revision) remains.
    del(&redis, &shard).await;
    let _: i64 = redis::cmd("HSET")
        .arg(&metadata)
        .arg("schemaVersion")
        .arg("1")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    assert_lost(&api, "metadata hash").await;
    // Nothing left in Redis (the periodic index rebuild may have re-indexed the damaged hash meanwhile: remove that
    // entry too). This coordinator still remembers serving the group: lost.
    del(&redis, &metadata).await;
    unindex(&redis).await;
    assert_lost(&api, "this coordinator's record").await;
    coord.shutdown().await;
    // A coordinator without that memory cannot tell it from a group that never existed (a documented limit).
    let fresh = coord_server::server::CoordinatorHandle::spawn(common::config(&redis.url()))
        .await
        .expect("coordinator starts");
    assert_never_created(&Api::new(fresh.url()), S, G).await;
    fresh.shutdown().await;
}

#[tokio::test]
async fn a_stream_without_routing_is_404_when_never_created_and_503_when_lost() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    for path in ["/v1/streams/nowhere/routing", "/v1/streams/nowhere"] {
        let body = error_json(api.get(path).await, StatusCode::NOT_FOUND, Status::NotFound).await;
        assert!(body.message.contains("never created"), "{path}: {}", body.message);
    }
    api.create_group(S, G, 2).await;
    del(&redis, &keys::stream_routing(&StreamName::new(S).expect("name"))).await;
    for path in ["/v1/streams/orders/routing", "/v1/streams/orders"] {
        let resp = api.get(path).await;
        assert!(resp.headers().get(RETRY_AFTER).is_some(), "{path}");
        let body = error_json(resp, StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable).await;
        assert!(body.message.contains("index"), "{path}: {}", body.message);
    }
    coord.shutdown().await;
}

#[tokio::test]
async fn never_created_groups_are_not_counted_as_unavailable_metadata() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let stats = coord.coordinator().stats();
    let before = coord_server::stats::Stats::get(&stats.metadata_unavailable);
    for i in 0..20 {
        let err = api.heartbeat(S, &format!("typo{i}"), &join("a")).await.unwrap_err();
        assert_eq!(err.1.status, Status::NotFound);
    }
    assert_eq!(
        coord_server::stats::Stats::get(&stats.metadata_unavailable),
        before,
        "a typo must not page anyone (the alert on metadata_unavailable_total)"
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn adding_shards_to_a_stream_never_created_is_404_and_to_a_lost_one_503() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    let grow = serde_json::json!({ "count": 2 });
    let resp = api.post(&protocol::routes::shards("nowhere"), &grow).await;
    assert!(resp.headers().get(RETRY_AFTER).is_none(), "nothing to wait for");
    let body = error_json(resp, StatusCode::NOT_FOUND, Status::NotFound).await;
    assert!(body.message.contains("never created"), "{}", body.message);
    let left = redis.snapshot_keys("*nowhere*").await;
    assert!(
        left.is_empty(),
        "a refused growth leaves no key: {:?}",
        left.keys().collect::<Vec<_>>()
    );

    api.create_group(S, G, 2).await;
    del(&redis, &keys::stream_routing(&StreamName::new(S).expect("name"))).await;
    let resp = api.post(&protocol::routes::shards(S), &grow).await;
    assert!(
        resp.headers().get(RETRY_AFTER).is_some(),
        "lost routing: retry after recreating"
    );
    let body = error_json(resp, StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable).await;
    assert!(body.message.contains("index"), "{}", body.message);
    coord.shutdown().await;
}
