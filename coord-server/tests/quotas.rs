//! Quotas per token over HTTP, against an in-process coordinator on a real Redis: each quota (groups, shards per
//! group, members per group, request rate) refused with `429`, `Retry-After` and a typed status, with nothing
//! changed in Redis; requests under the limit accepted; one token at its limits does not touch another's; the
//! caller's usage on `GET /v1/quota` and `/status`; the refusals counted in `/metrics`. Under concurrency: 50
//! creates or add-shards of one token over two replicas end at exactly the quota, and the token's group-create
//! mutex (`coordinator/quota/lock.rs`) outlives a slow create and gives way to a dead holder by its TTL.

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

/// Two coordinator replicas on one Redis with `table`, patient enough (10 s mutex TTL, 8 s wait) that 50 requests
/// queued on one lock are answered by the quota, never by a timeout; their ticks never fire while a test runs.
async fn two_replicas(table: &str) -> (RedisServer, [CoordinatorHandle; 2]) {
    let redis = RedisServer::start().await;
    let spawn = || async {
        let mut c = common::config(&redis.url());
        c.tick_interval = Duration::from_secs(3600);
        c.mutex_ttl = Duration::from_secs(10);
        c.critical_section_timeout = Duration::from_secs(8);
        c.request_timeout = Duration::from_secs(20);
        c.shutdown_grace = Duration::from_secs(21);
        c.default_timings = patient_timings();
        c.tokens = Grant::parse_table(table).expect("table");
        CoordinatorHandle::spawn(c).await.expect("coordinator starts")
    };
    let first = spawn().await;
    let second = spawn().await;
    (redis, [first, second])
}

/// Sorts `answers` into the successes (`ok`) and the `429 QUOTA_EXCEEDED` refusals; any other answer fails the
/// test, after every answer was sorted (so the message names them all).
async fn successes_and_refusals(answers: Vec<Response>, ok: StatusCode) -> (usize, usize) {
    let (mut admitted, mut refused, mut other) = (0, 0, Vec::new());
    for resp in answers {
        if resp.status() == ok {
            admitted += 1;
        } else if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            too_many(resp, Status::QuotaExceeded).await;
            refused += 1;
        } else {
            other.push(format!("{}: {}", resp.status(), resp.text().await.unwrap_or_default()));
        }
    }
    let count = other.len();
    other.dedup();
    assert!(
        other.is_empty(),
        "{admitted} admitted, {refused} refused, and {count} other answers: {other:?}"
    );
    (admitted, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_creates_over_two_replicas_stop_at_the_group_quota() {
    let create = CreateGroupRequest {
        shard_count: Some(1),
        timings: Some(patient_timings()),
    };
    let (redis, replicas) = two_replicas("admin:tenant-a.:admin-a name=tenant-a-admin groups=3").await;
    let apis: Vec<Api> = replicas
        .iter()
        .map(|c| Api::new(c.url()).with_token("admin-a"))
        .collect();
    let started = Instant::now();
    // Five streams, so some creates also create their stream's routing and some find it there.
    let answers = futures::future::join_all((0..50).map(|i| {
        let path = protocol::routes::group(&format!("tenant-a.s{}", i % 5), &format!("g{i}"));
        let (api, create) = (apis[i % 2].clone(), &create);
        async move { api.post(&path, create).await }
    }))
    .await;
    let elapsed = started.elapsed();
    let (created, refused) = successes_and_refusals(answers, StatusCode::CREATED).await;
    println!("50 concurrent creates, groups=3: {created} created, {refused} refused in {elapsed:?}");
    assert_eq!((created, refused), (3, 47));

    let mut con = redis.connection().await;
    let indexed: Vec<String> = redis::cmd("SMEMBERS")
        .arg(protocol::keys::groups_index())
        .query_async(&mut con)
        .await
        .expect("SMEMBERS");
    assert_eq!(indexed.len(), 3, "{indexed:?}");
    let hashes: Vec<String> = redis::cmd("KEYS")
        .arg(protocol::keys::group_metadata_pattern())
        .query_async(&mut con)
        .await
        .expect("KEYS");
    assert_eq!(hashes.len(), 3, "{hashes:?}");
    // A refused create writes nothing, not even its new stream's routing.
    let mut streams: Vec<&str> = indexed.iter().filter_map(|m| m.split(':').next()).collect();
    streams.sort();
    streams.dedup();
    let routings: Vec<String> = redis::cmd("KEYS")
        .arg("redis-stream:coord:{*}:routing")
        .query_async(&mut con)
        .await
        .expect("KEYS");
    assert_eq!(routings.len(), streams.len(), "{routings:?} for {streams:?}");
    // And the quota stays full: a later create on either replica is refused.
    for api in &apis {
        let resp = api.post(&protocol::routes::group("tenant-a.late", "g"), &create).await;
        too_many(resp, Status::QuotaExceeded).await;
    }
    for c in replicas {
        c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_add_shards_over_two_replicas_stop_at_the_shard_quota() {
    let (redis, replicas) = two_replicas("admin:tenant-a.:admin-a name=tenant-a-admin shards=16").await;
    let apis: Vec<Api> = replicas
        .iter()
        .map(|c| Api::new(c.url()).with_token("admin-a"))
        .collect();
    apis[0]
        .create_group_with("tenant-a.grow", "g", 1, patient_timings())
        .await;
    let path = protocol::routes::shards("tenant-a.grow");
    let started = Instant::now();
    let answers = futures::future::join_all((0..50).map(|i| {
        let (api, path) = (apis[i % 2].clone(), path.clone());
        async move { api.post(&path, &AddShardsRequest { count: 1 }).await }
    }))
    .await;
    let elapsed = started.elapsed();
    let (grown, refused) = successes_and_refusals(answers, StatusCode::OK).await;
    let stream = protocol::names::StreamName::new("tenant-a.grow").expect("stream");
    let described: protocol::messages::RoutingDescription = ok_json(
        apis[1].get(&protocol::routes::stream(stream.as_str())).await,
        StatusCode::OK,
    )
    .await;
    println!(
        "50 concurrent add-shards of 1, shards=16 from 1: {grown} grown, {refused} refused, {} shards in {elapsed:?}",
        described.shard_count
    );
    assert_eq!(described.shard_count, 16);
    assert_eq!((grown, refused), (15, 35));
    // A refused growth writes nothing: no record of a shard past the quota.
    let mut con = redis.connection().await;
    let beyond: i64 = redis::cmd("EXISTS")
        .arg(protocol::keys::shard_fence(&stream, protocol::ShardId(16)))
        .query_async(&mut con)
        .await
        .expect("EXISTS");
    assert_eq!(beyond, 0);
    for c in replicas {
        c.shutdown().await;
    }
}

#[tokio::test]
async fn a_dead_holders_quota_mutex_holds_up_only_its_token_and_only_until_it_expires() {
    let (redis, coord) = start().await;
    let (a, b) = (
        Api::new(coord.url()).with_token("admin-a"),
        Api::new(coord.url()).with_token("admin-b"),
    );
    let mut con = redis.connection().await;
    let mutex = protocol::keys::quota_mutex("tenant-a-admin");
    // A coordinator died holding tenant a's mutex, which lives on for a minute: a's create waits the section
    // timeout (600 ms here) and answers a retryable 503, having written nothing.
    let _: () = redis::cmd("SET")
        .arg(&mutex)
        .arg("a-dead-coordinator")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut con)
        .await
        .expect("SET");
    let before = contents(&redis).await;
    let resp = a
        .post(&protocol::routes::group("tenant-a.one", "g1"), &create_req(1))
        .await;
    error_json(resp, StatusCode::SERVICE_UNAVAILABLE, Status::StoreUnavailable).await;
    assert_eq!(contents(&redis).await, before);
    // Tenant b's creates do not wait for a's mutex.
    b.create_group("tenant-b.one", "g1", 1).await;
    // Once the dead holder's mutex expires, a's next create takes it, creates, and frees it.
    let _: () = redis::cmd("SET")
        .arg(&mutex)
        .arg("a-dead-coordinator")
        .arg("PX")
        .arg(300)
        .query_async(&mut con)
        .await
        .expect("SET");
    let started = Instant::now();
    a.create_group("tenant-a.one", "g1", 1).await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "created after {:?}, while the dead holder's mutex still lived",
        started.elapsed()
    );
    let left: i64 = redis::cmd("EXISTS")
        .arg(&mutex)
        .query_async(&mut con)
        .await
        .expect("EXISTS");
    assert_eq!(left, 0, "the create frees the mutex");
    coord.shutdown().await;
}

#[tokio::test]
async fn the_quota_mutex_is_renewed_and_freed_only_by_its_holder() {
    let redis = RedisServer::start().await;
    let store = coord_server::store::Store::new(redis.connection_manager().await);
    let mut con = redis.connection().await;
    let key = protocol::keys::quota_mutex("t");
    let pttl = |con: &mut redis::aio::MultiplexedConnection| {
        let key = key.clone();
        let mut con = con.clone();
        async move {
            let ms: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut con).await.expect("PTTL");
            ms
        }
    };
    let ttl = Duration::from_secs(5);
    assert!(store
        .try_take_quota_mutex(&key, "one", Duration::from_millis(500))
        .await
        .unwrap());
    assert!(!store.try_take_quota_mutex(&key, "two", ttl).await.unwrap(), "held");
    assert!(store.renew_quota_mutex(&key, "one", ttl).await.unwrap());
    assert!(pttl(&mut con).await > 1000, "renewed to 5 s");
    assert!(
        !store.renew_quota_mutex(&key, "two", ttl).await.unwrap(),
        "not two's to renew"
    );
    store.release_quota_mutex(&key, "two").await.unwrap();
    let held: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut con).await.expect("GET");
    assert_eq!(held.as_deref(), Some("one"), "not two's to free");
    store.release_quota_mutex(&key, "one").await.unwrap();
    assert_eq!(pttl(&mut con).await, -2, "freed by its holder");
    assert!(
        !store.renew_quota_mutex(&key, "one", ttl).await.unwrap(),
        "a freed mutex is not renewed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_slower_than_the_mutex_ttl_keeps_its_tokens_mutex() {
    let redis = RedisServer::start().await;
    let table = "admin:tenant-a.:admin-a name=tenant-a-admin groups=2 shards=65536\nadmin:*:operator name=platform";
    let spawn = || async {
        let mut c = common::config(&redis.url());
        c.tokens = Grant::parse_table(table).expect("table");
        // The slow create is answered, however slow the machine.
        c.request_timeout = Duration::from_secs(60);
        c.shutdown_grace = Duration::from_secs(61);
        CoordinatorHandle::spawn(c).await.expect("coordinator starts")
    };
    let (first, second) = (spawn().await, spawn().await);
    let a1 = Api::new(first.url()).with_token("admin-a");
    let a2 = Api::new(second.url()).with_token("admin-a");
    // One of tenant a's two groups, on a stream whose routing then exists.
    Api::new(first.url())
        .with_token("operator")
        .create_group("tenant-a.old", "g0", 1)
        .await;

    // A create of a new stream of 65,536 shards on the first replica writes as many shard records before it
    // indexes its group, holding the token's mutex for longer than its 900 ms TTL.
    let started = Instant::now();
    let slow = tokio::spawn({
        let a1 = a1.clone();
        async move {
            a1.post(&protocol::routes::group("tenant-a.new", "g1"), &create_req(65_536))
                .await
        }
    });
    let mut con = redis.connection().await;
    let mutex = protocol::keys::quota_mutex("tenant-a-admin");
    wait_until(Duration::from_secs(5), "the slow create holds the mutex", || {
        let (mut con, mutex) = (con.clone(), mutex.clone());
        async move {
            let n: i64 = redis::cmd("EXISTS")
                .arg(&mutex)
                .query_async(&mut con)
                .await
                .expect("EXISTS");
            n == 1
        }
    })
    .await;
    // Meanwhile creates on the second replica find the mutex held (renewed) and answer 503, however long the
    // slow one takes; had it expired, one of them would count one group and create a third.
    let mut tries = Vec::new();
    let mut i = 0;
    while !slow.is_finished() {
        i += 1;
        let resp = a2
            .post(
                &protocol::routes::group("tenant-a.old", &format!("g{i}")),
                &create_req(1),
            )
            .await;
        tries.push(resp.status());
        // A 429: the slow create's group is indexed, and the count holds from now on.
        if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
    }
    let slow = slow.await.expect("the slow create");
    let took = started.elapsed();
    println!(
        "slow create: {} after {took:?}; creates meanwhile: {tries:?}",
        slow.status()
    );
    assert_eq!(slow.status(), StatusCode::CREATED);
    assert!(
        tries
            .iter()
            .all(|s| *s == StatusCode::SERVICE_UNAVAILABLE || *s == StatusCode::TOO_MANY_REQUESTS),
        "{tries:?}"
    );
    let indexed: Vec<String> = redis::cmd("SMEMBERS")
        .arg(protocol::keys::groups_index())
        .query_async(&mut con)
        .await
        .expect("SMEMBERS");
    assert_eq!(indexed.len(), 2, "{indexed:?}");
    first.shutdown().await;
    second.shutdown().await;
}
