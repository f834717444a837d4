//! The producer's coordinator side with scripted HTTP answers (wiremock), and a real redis-server for the writes:
//! single flight, failover on `COORDINATOR_TERMINATING`, and replacement rules that a healthy coordinator never
//! exercises (an older `OK` answer). The lease from the send time and the refresh schedule are tested under paused
//! time with an in-memory coordinator (`src/refresher.rs`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{total_len, DEADLINE, STREAM};
use protocol::RoutingVersion;
use protocol::Status;
use serde_json::json;
use stream_producer::{Producer, ProducerBuilder, PublishError, WriteState};
use test_support::{wait_until, RedisServer};
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

const ROUTING_PATH: &str = "/v1/streams/orders/routing";

fn routing_body(status: &str, version: u64, shards: u32, lease_ms: u64) -> serde_json::Value {
    json!({
        "status": status,
        "stream": STREAM,
        "routingVersion": version,
        "shardCount": shards,
        "routingLeaseMs": lease_ms,
        "refreshIntervalMs": lease_ms / 3,
    })
}

fn ok(version: u64, shards: u32, lease_ms: u64) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(routing_body("OK", version, shards, lease_ms))
}

async fn routing_requests(server: &MockServer) -> usize {
    server
        .received_requests()
        .await
        .expect("request recording is on")
        .iter()
        .filter(|r| r.url.path() == ROUTING_PATH)
        .count()
}

fn builder(coordinators: &[String], redis: &RedisServer) -> ProducerBuilder {
    common::isolated(Producer::builder(STREAM))
        .coordinators(coordinators.iter().cloned())
        .redis(redis.url())
}

fn producer(coordinators: &[String], redis: &RedisServer) -> Producer {
    builder(coordinators, redis).build().unwrap()
}

fn refusal(http: u16, status: &str) -> ResponseTemplate {
    ResponseTemplate::new(http).set_body_json(json!({ "status": status, "message": "scripted refusal" }))
}

#[tokio::test]
async fn concurrent_publishes_share_one_refresh() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        // Slow enough that every publish below arrives while the first refresh is in flight.
        .respond_with(ok(1, 4, 60_000).set_delay(Duration::from_millis(500)))
        .mount(&coord)
        .await;
    let producer = Arc::new(producer(&[coord.uri()], &redis));
    let sends: Vec<_> = (0..50)
        .map(|i| {
            let producer = producer.clone();
            tokio::spawn(async move { producer.send(format!("k{i}"), &[("f", "v")]).await })
        })
        .collect();
    for s in sends {
        s.await.unwrap().unwrap();
    }
    assert_eq!(
        routing_requests(&coord).await,
        1,
        "one refresh for 50 publishes and the background refresher"
    );
    assert_eq!(producer.stats().refreshes, 1);
    assert_eq!(total_len(&redis, 4).await, 50);
    Arc::into_inner(producer).unwrap().close().await.unwrap();
}

#[tokio::test]
async fn terminating_coordinator_hands_over_to_the_next_url_at_once() {
    let redis = RedisServer::start().await;
    let terminating = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ResponseTemplate::new(503).set_body_json(json!({
            "status": "COORDINATOR_TERMINATING",
            "message": "shutting down",
        })))
        .mount(&terminating)
        .await;
    let healthy = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ok(3, 2, 60_000))
        .mount(&healthy)
        .await;
    let producer = producer(&[terminating.uri(), healthy.uri()], &redis);
    let routing = producer.ready().await.unwrap();
    assert_eq!((routing.version, routing.shard_count), (RoutingVersion(3), 2));
    assert_eq!(
        routing_requests(&terminating).await,
        1,
        "tried once, then the next URL in the same refresh"
    );
    assert_eq!(routing_requests(&healthy).await, 1);
    assert_eq!(producer.stats().refresh_failures, 0);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn every_refresh_carries_current_and_highest_observed_versions() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .and(query_param("routingVersion", "0"))
        .respond_with(ok(5, 2, 1_500))
        .mount(&coord)
        .await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .and(query_param("routingVersion", "5"))
        .and(query_param("maxObservedVersion", "5"))
        .respond_with(ok(5, 2, 1_500))
        .mount(&coord)
        .await;
    let producer = producer(&[coord.uri()], &redis);
    producer.ready().await.unwrap();
    wait_until(DEADLINE, "a periodic refresh with both versions", || {
        let refreshes = producer.stats().refreshes;
        async move { refreshes >= 2 }
    })
    .await;
    assert_eq!(producer.stats().refresh_failures, 0, "every request matched a mock");
    producer.close().await.unwrap();
}

#[tokio::test]
async fn older_ok_answer_does_not_replace_the_cache() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ok(2, 6, 1_500))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&coord)
        .await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ok(1, 4, 1_500))
        .with_priority(2)
        .mount(&coord)
        .await;
    let producer = producer(&[coord.uri()], &redis);
    assert_eq!(producer.ready().await.unwrap().version, RoutingVersion(2));
    wait_until(DEADLINE, "an older answer arrived", || {
        let ignored = producer.stats().ignored_older_responses;
        async move { ignored >= 1 }
    })
    .await;
    let stats = producer.stats();
    assert_eq!(stats.shard_count, Some(6), "version 2 kept: {stats:?}");
    assert_eq!(stats.routing_version, Some(RoutingVersion(2)));
    producer.close().await.unwrap();
}

#[tokio::test]
async fn without_any_routing_publishes_fail_closed() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ResponseTemplate::new(503).set_body_json(json!({
            "status": "METADATA_UNAVAILABLE",
            "message": "stream orders has no routing",
        })))
        .mount(&coord)
        .await;
    let producer = producer(&[coord.uri()], &redis);
    let err = producer.send("k", &[("f", "v")]).await.unwrap_err();
    assert!(
        matches!(
            err,
            PublishError::NoRouting {
                last_error: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.write_state(), WriteState::NotWritten);
    assert_eq!(total_len(&redis, 1).await, 0);
    assert_eq!(
        redis::cmd("DBSIZE")
            .query_async::<u64>(&mut redis.connection().await)
            .await
            .unwrap(),
        0,
        "nothing at all was written"
    );
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_stream_that_was_never_created_is_a_final_error() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({
            "status": "NOT_FOUND",
            "message": "stream orders was never created",
        })))
        .mount(&coord)
        .await;
    let producer = producer(&[coord.uri()], &redis);
    let err = producer.send("k", &[("f", "v")]).await.unwrap_err();
    let PublishError::NoRouting {
        last_error: Some(last), ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert!(last.is_not_found(), "{last:?}");
    assert!(
        !err.is_retryable(),
        "retrying a stream that does not exist cannot succeed"
    );
    assert_eq!(err.write_state(), WriteState::NotWritten);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn failed_refreshes_keep_the_cache_until_the_lease_ends_then_publishes_fail_closed() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ok(1, 2, 1_500))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&coord)
        .await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ResponseTemplate::new(503).set_body_json(json!({
            "status": "STORE_UNAVAILABLE",
            "message": "redis down",
        })))
        .with_priority(2)
        .mount(&coord)
        .await;
    let producer = producer(&[coord.uri()], &redis);
    producer.ready().await.unwrap();
    wait_until(DEADLINE, "a refresh failed", || {
        let failures = producer.stats().refresh_failures;
        async move { failures >= 1 }
    })
    .await;
    // Still inside the lease: the cached routing is used.
    assert!(producer.lease_remaining().is_some());
    producer.send("during", &[("f", "v")]).await.unwrap();
    // Past the lease: every publish fails closed with the typed error.
    wait_until(DEADLINE, "lease ended", || {
        let valid = producer.routing().is_some();
        async move { !valid }
    })
    .await;
    let err = producer.send("after", &[("f", "v")]).await.unwrap_err();
    assert!(
        matches!(
            err,
            PublishError::RoutingExpired {
                last_error: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(total_len(&redis, 2).await, 1, "only the record sent inside the lease");
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_rate_limited_refresh_is_not_retried_before_the_retry_after() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "1")
                .set_body_json(json!({
                    "status": "RATE_LIMITED",
                    "message": "token t sent more than its 5 requests per second",
                    "retryAfterMs": 800,
                })),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&coord)
        .await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ok(1, 2, 60_000))
        .with_priority(2)
        .mount(&coord)
        .await;
    // A Retry-After past the coordinator timeout: `ready` does not wait it out.
    let producer = builder(&[coord.uri()], &redis)
        .coordinator_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let err = producer.ready().await.expect_err("the first refresh is refused");
    assert!(matches!(err, PublishError::NoRouting { .. }), "{err}");
    wait_until(DEADLINE, "a routing after the Retry-After", || async {
        producer.ready().await.is_ok()
    })
    .await;
    // The retry policy alone (50 ms at first) would have asked again at once.
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(routing_requests(&coord).await, 2, "no request inside the Retry-After");
    producer.close().await.unwrap();
}

#[tokio::test]
async fn ready_waits_out_retryable_answers_until_the_routing_comes() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    // What a coordinator answers while its Redis restarts, then while one instance shuts down.
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(refusal(503, "STORE_UNAVAILABLE"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&coord)
        .await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(refusal(503, "COORDINATOR_TERMINATING"))
        .up_to_n_times(1)
        .with_priority(2)
        .mount(&coord)
        .await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(ok(2, 3, 60_000))
        .with_priority(3)
        .mount(&coord)
        .await;
    let producer = producer(&[coord.uri()], &redis);
    let routing = producer.ready().await.expect("the retryable answers are waited out");
    assert_eq!((routing.version, routing.shard_count), (RoutingVersion(2), 3));
    assert_eq!(routing_requests(&coord).await, 3, "two refusals, then the routing");
    assert_eq!(producer.stats().refresh_failures, 2);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn ready_gives_up_after_the_coordinator_timeout_naming_the_last_cause() {
    let redis = RedisServer::start().await;
    let coord = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ROUTING_PATH))
        .respond_with(refusal(503, "STORE_UNAVAILABLE"))
        .mount(&coord)
        .await;
    let timeout = Duration::from_millis(1_000);
    let producer = builder(&[coord.uri()], &redis)
        .coordinator_timeout(timeout)
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let err = producer
        .ready()
        .await
        .expect_err("the coordinator never answers a routing");
    let elapsed = started.elapsed();
    let PublishError::NoRouting {
        last_error: Some(last), ..
    } = &err
    else {
        panic!("{err:?}");
    };
    let stream_producer::RefreshError::Coordinator(cause) = last.as_ref() else {
        panic!("{last:?}");
    };
    assert_eq!(cause.status(), Some(Status::StoreUnavailable), "{cause}");
    assert!(err.is_retryable(), "{err}");
    // Backoff 50, 100, 200, 400 ms: attempts at 0, 50, 150, 350 and 750 ms; the next (1 550 ms) is past 1 s.
    assert!(routing_requests(&coord).await >= 5, "retried within the timeout");
    assert!(
        elapsed < timeout + Duration::from_secs(2),
        "bounded by the timeout: {elapsed:?}"
    );
    producer.close().await.unwrap();
}

#[tokio::test]
async fn ready_fails_at_once_on_a_final_answer() {
    let redis = RedisServer::start().await;
    for (http, status, expected) in [
        (401, "UNAUTHORIZED", Status::Unauthorized),
        (404, "NOT_FOUND", Status::NotFound),
        (400, "INVALID_REQUEST", Status::InvalidRequest),
    ] {
        let coord = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path(ROUTING_PATH))
            .respond_with(refusal(http, status))
            .mount(&coord)
            .await;
        let timeout = Duration::from_secs(5);
        let producer = builder(&[coord.uri()], &redis)
            .coordinator_timeout(timeout)
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let err = producer.ready().await.expect_err("a final answer");
        let elapsed = started.elapsed();
        let PublishError::NoRouting {
            last_error: Some(last), ..
        } = &err
        else {
            panic!("{status}: {err:?}");
        };
        assert!(!last.is_retryable(), "{status}: {last}");
        let stream_producer::RefreshError::Coordinator(cause) = last.as_ref() else {
            panic!("{status}: {last:?}");
        };
        assert_eq!(cause.status(), Some(expected));
        // A retrying `ready` would only give up once the 5 s are nearly spent.
        assert!(elapsed < timeout / 2, "{status}: failed after {elapsed:?}");
        producer.close().await.unwrap();
    }
}
