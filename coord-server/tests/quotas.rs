//! Quotas per token over HTTP, against an in-process coordinator on a real Redis: each quota (groups, shards per
//! group, members per group, request rate) refused with `429`, `Retry-After` and a typed status, with nothing
//! changed in Redis; requests under the limit accepted; one token at its limits does not touch another's; the
//! caller's usage on `GET /v1/quota` and `/status`; the refusals counted in `/metrics`.

mod common;

use common::*;
use coord_server::auth::Grant;
use coord_server::server::CoordinatorHandle;
use protocol::messages::{AddShardsRequest, CreateGroupRequest, ErrorResponse, QuotaDescription};
use protocol::Status;
use reqwest::header::RETRY_AFTER;
use reqwest::{Response, StatusCode};
use std::time::{Duration, Instant};
use test_support::{wait_until, RedisServer};

/// Two tenants with tight quotas, and an operator with a generous one.
const TABLE: &str = "\
admin:tenant-a.:admin-a name=tenant-a-admin groups=2 shards=8
consumer:tenant-a.:consumer-a name=tenant-a-consumer members=2
producer:tenant-a.:producer-a name=tenant-a-producer rate=5 burst=10
admin:tenant-b.:admin-b name=tenant-b-admin groups=2 shards=8
consumer:tenant-b.:consumer-b members=2
producer:tenant-b.:producer-b rate=5 burst=10
admin:*:operator name=platform groups=1000 rate=100000 burst=100000
";

/// A coordinator with `table` whose tick never fires while a test runs: a refused request is then the only thing
/// that could change Redis between two snapshots.
async fn start_with(table: &str) -> (RedisServer, CoordinatorHandle) {
    let redis = RedisServer::start().await;
    let mut c = common::config(&redis.url());
    c.tick_interval = Duration::from_secs(3600);
    c.tokens = Grant::parse_table(table).expect("table");
    let coord = CoordinatorHandle::spawn(c).await.expect("coordinator starts");
    (redis, coord)
}

async fn start() -> (RedisServer, CoordinatorHandle) {
    start_with(TABLE).await
}

fn create_req(shards: u32) -> CreateGroupRequest {
    CreateGroupRequest {
        shard_count: Some(shards),
        timings: Some(timings()),
    }
}

/// A `429` with a `Retry-After` of at least one second and the typed `status`.
async fn too_many(resp: Response, status: Status) -> ErrorResponse {
    let retry_after: u64 = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After header in whole seconds");
    assert!(retry_after >= 1, "Retry-After {retry_after}");
    let body = error_json(resp, StatusCode::TOO_MANY_REQUESTS, status).await;
    let ms = body.retry_after_ms.expect("retryAfterMs");
    assert_eq!(retry_after, ms.div_ceil(1000), "header and body agree");
    body
}

/// Every key with what it holds, by type (hash fields sorted). Not `DUMP`: a hash of more than a few fields is a
/// hash table in Redis, whose `DUMP` follows the table's order, and a read can move that order on (incremental
/// rehashing) without any write.
async fn contents(redis: &RedisServer) -> Vec<(String, String)> {
    let mut con = redis.connection().await;
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut con).await.expect("KEYS");
    keys.sort();
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut con).await.expect("TYPE");
        let value = match kind.as_str() {
            "hash" => {
                let fields: std::collections::BTreeMap<String, Vec<u8>> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(&mut con)
                    .await
                    .expect("HGETALL");
                format!("{fields:?}")
            }
            "string" => {
                let v: Vec<u8> = redis::cmd("GET").arg(&key).query_async(&mut con).await.expect("GET");
                format!("{v:?}")
            }
            "set" => {
                let mut v: Vec<Vec<u8>> = redis::cmd("SMEMBERS")
                    .arg(&key)
                    .query_async(&mut con)
                    .await
                    .expect("SMEMBERS");
                v.sort();
                format!("{v:?}")
            }
            _ => {
                let v: redis::Value = redis::cmd("DUMP").arg(&key).query_async(&mut con).await.expect("DUMP");
                format!("{v:?}")
            }
        };
        out.push((key, format!("{kind}: {value}")));
    }
    out
}

#[tokio::test]
async fn every_quota_is_refused_with_429_and_changes_nothing() {
    let (redis, coord) = start().await;
    let a = Api::new(coord.url()).with_token("admin-a");
    let b = Api::new(coord.url()).with_token("admin-b");
    let consumer_a = Api::new(coord.url()).with_token("consumer-a");
    let consumer_b = Api::new(coord.url()).with_token("consumer-b");
    let group = |s: &str, g: &str| protocol::routes::group(s, g);

    // Under the limits: accepted.
    a.create_group("tenant-a.one", "g1", 8).await;
    // Shards per group, at create: nothing written, not even the new stream's routing.
    let before = contents(&redis).await;
    let resp = a.post(&group("tenant-a.two", "g2"), &create_req(9)).await;
    let body = too_many(resp, Status::QuotaExceeded).await;
    assert!(
        body.message.contains("tenant-a-admin") && body.message.contains("8"),
        "{}",
        body.message
    );
    assert_eq!(contents(&redis).await, before);
    // Shards per group, at add-shards.
    let resp = a
        .post(
            &protocol::routes::shards("tenant-a.one"),
            &AddShardsRequest { count: 1 },
        )
        .await;
    too_many(resp, Status::QuotaExceeded).await;
    assert_eq!(contents(&redis).await, before);
    // A total no stream may have is invalid whatever the quota: 400, not a 429 that invites a retry.
    let resp = a
        .post(
            &protocol::routes::shards("tenant-a.one"),
            &AddShardsRequest {
                count: protocol::metadata::MAX_SHARDS - 1,
            },
        )
        .await;
    error_json(resp, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;
    assert_eq!(contents(&redis).await, before);
    // Groups: the second is accepted, the third refused, on any stream the token reaches.
    a.create_group("tenant-a.two", "g2", 4).await;
    let before = contents(&redis).await;
    let resp = a.post(&group("tenant-a.three", "g3"), &create_req(1)).await;
    let body = too_many(resp, Status::QuotaExceeded).await;
    assert!(body.message.contains("2 groups"), "{}", body.message);
    assert_eq!(body.retry_after_ms, Some(60_000));
    assert_eq!(contents(&redis).await, before);

    // Members per group: two join, the third is refused and nothing is written; a known member rejoins.
    consumer_a.hb("tenant-a.one", "g1", &join("m1")).await;
    consumer_a.hb("tenant-a.one", "g1", &join("m2")).await;
    let before = contents(&redis).await;
    let resp = consumer_a
        .post(&protocol::routes::heartbeat("tenant-a.one", "g1"), &join("m3"))
        .await;
    let body = too_many(resp, Status::QuotaExceeded).await;
    assert!(
        body.message.contains("m3") && body.message.contains("(2)"),
        "{}",
        body.message
    );
    assert_eq!(contents(&redis).await, before);
    consumer_a.hb("tenant-a.one", "g1", &join("m1")).await;
    assert_eq!(a.describe("tenant-a.one", "g1").await.members.len(), 2);

    // Tenant b, with the same quotas, is not touched by a's being at every limit.
    b.create_group("tenant-b.one", "g1", 8).await;
    b.create_group("tenant-b.two", "g2", 8).await;
    consumer_b.hb("tenant-b.one", "g1", &join("m1")).await;
    consumer_b.hb("tenant-b.one", "g1", &join("m2")).await;

    // The caller's view of its quotas.
    let view: QuotaDescription = ok_json(a.get(protocol::routes::QUOTA).await, StatusCode::OK).await;
    assert_eq!(view.token, "tenant-a-admin");
    assert_eq!((view.groups.used, view.groups.limit), (2, 2));
    assert_eq!((view.shards_per_group.used, view.shards_per_group.limit), (8, 8));
    assert_eq!(view.members_per_group.used, 2);
    let page = a.get("/status").await.text().await.expect("page");
    assert!(
        page.contains("<h2>Quotas</h2>") && page.contains("tenant-a-admin"),
        "{page}"
    );
    assert!(!page.contains("tenant-b-admin"), "a tenant sees only its own token");
    let operator_page = Api::new(coord.url()).with_token("operator").get("/status").await;
    let operator_page = operator_page.text().await.expect("page");
    assert!(operator_page.contains("tenant-b-admin") && operator_page.contains("tenant-a-producer"));

    let metrics = Api::new(coord.url())
        .get("/metrics")
        .await
        .text()
        .await
        .expect("metrics");
    for (quota, n) in [("groups", 1), ("shards", 2), ("members", 1)] {
        let line = format!("redis_stream_coord_quota_refusals_total{{quota=\"{quota}\"}} {n}");
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
    coord.shutdown().await;
}

#[tokio::test]
async fn the_rate_limit_admits_a_burst_then_answers_429_per_token() {
    let (_redis, coord) = start().await;
    let operator = Api::new(coord.url()).with_token("operator");
    operator.create_group("tenant-a.s", "g", 2).await;
    operator.create_group("tenant-b.s", "g", 2).await;
    let (a, b) = (
        Api::new(coord.url()).with_token("producer-a"),
        Api::new(coord.url()).with_token("producer-b"),
    );
    let path_a = protocol::routes::routing("tenant-a.s");
    let started = Instant::now();
    let answers = futures::future::join_all((0..40).map(|_| a.get(&path_a))).await;
    let elapsed = started.elapsed();
    let mut admitted = 0;
    let mut limited = Vec::new();
    for resp in answers {
        match resp.status() {
            StatusCode::OK => admitted += 1,
            _ => limited.push(too_many(resp, Status::RateLimited).await),
        }
    }
    // The burst (10) plus what 5/s refilled while the 40 requests were answered.
    let refilled = (elapsed.as_secs_f64() * 5.0).ceil() as usize;
    println!(
        "burst test: {admitted} admitted, {} answered 429 in {elapsed:?}",
        limited.len()
    );
    assert!(
        (10..=10 + refilled).contains(&admitted),
        "{admitted} admitted in {elapsed:?}"
    );
    assert_eq!(admitted + limited.len(), 40);
    assert!(
        limited.iter().all(|e| e.retry_after_ms.is_some_and(|ms| ms <= 200)),
        "{limited:?}"
    );
    // Tenant b's producer is not limited by a's.
    ok_json::<serde_json::Value>(b.get(&protocol::routes::routing("tenant-b.s")).await, StatusCode::OK).await;
    let metrics = Api::new(coord.url())
        .get("/metrics")
        .await
        .text()
        .await
        .expect("metrics");
    let counted: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix("redis_stream_coord_quota_refusals_total{quota=\"rate\"} "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the rate refusals are counted");
    assert_eq!(counted, limited.len());
    // The bucket refills: a's next request after the wait is admitted.
    wait_until(Duration::from_secs(5), "a token back in the bucket", || async {
        a.get(&path_a).await.status() == StatusCode::OK
    })
    .await;
    coord.shutdown().await;
}

#[tokio::test]
async fn a_rate_limited_request_is_refused_before_its_body_is_read() {
    let (redis, coord) = start_with("admin:*:op\nconsumer:*:slow rate=1 burst=1").await;
    Api::new(coord.url()).with_token("op").create_group("s", "g", 1).await;
    let slow = Api::new(coord.url()).with_token("slow");
    slow.hb("s", "g", &join("m")).await;
    let before = contents(&redis).await;
    // Not JSON at all: read, it would be a 400.
    let resp = slow
        .request(reqwest::Method::POST, &protocol::routes::heartbeat("s", "g"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body("{not json")
        .send()
        .await
        .expect("sent");
    too_many(resp, Status::RateLimited).await;
    assert_eq!(contents(&redis).await, before);
    coord.shutdown().await;
}

#[tokio::test]
async fn a_coordinator_without_tokens_enforces_no_quota() {
    let redis = RedisServer::start().await;
    let mut c = common::config(&redis.url());
    c.quota = coord_server::quota::Quota {
        groups: 1,
        members_per_group: 1,
        ..Default::default()
    };
    let coord = CoordinatorHandle::spawn(c).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    // A tight default applies to tokens only: the open caller creates and joins past it.
    for i in 0..3 {
        let g = format!("g{i}");
        api.create_group("s", &g, 1).await;
        for m in ["m1", "m2", "m3"] {
            api.hb("s", &g, &join(m)).await;
        }
    }
    let view: QuotaDescription = ok_json(api.get(protocol::routes::QUOTA).await, StatusCode::OK).await;
    assert_eq!(view.token, "open");
    assert_eq!((view.groups.used, view.groups.limit), (3, u32::MAX));
    assert_eq!(view.members_per_group.used, 3);
    coord.shutdown().await;
}

#[tokio::test]
async fn a_recreate_is_held_to_the_shard_quota() {
    let (redis, coord) = start().await;
    let a = Api::new(coord.url()).with_token("admin-a");
    a.create_group("tenant-a.one", "g1", 4).await;
    // The group and its stream's routing are lost: a recreate asks for more shards than the quota allows.
    let mut conn = redis.connection().await;
    let stream = protocol::names::StreamName::new("tenant-a.one").expect("stream");
    let _: i64 = redis::cmd("DEL")
        .arg(metadata_key("tenant-a.one", "g1"))
        .arg(protocol::keys::stream_routing(&stream))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let before = contents(&redis).await;
    let req = protocol::messages::RecreateGroupRequest {
        confirm: true,
        shard_count: 9,
        timings: Some(timings()),
    };
    let resp = a.post(&protocol::routes::recreate("tenant-a.one", "g1"), &req).await;
    too_many(resp, Status::QuotaExceeded).await;
    assert_eq!(contents(&redis).await, before);
    // Within the quota it is recreated; the index already listed it, so the group quota is not spent twice.
    let req = protocol::messages::RecreateGroupRequest { shard_count: 4, ..req };
    ok_json::<serde_json::Value>(
        a.post(&protocol::routes::recreate("tenant-a.one", "g1"), &req).await,
        StatusCode::CREATED,
    )
    .await;
    coord.shutdown().await;
}
