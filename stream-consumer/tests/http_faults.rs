//! HTTP-level coordinator faults, with a wiremock coordinator: a group that does not exist, a lost join answer,
//! a terminating coordinator followed by a healthy one, a join over the member quota, a rate-limited join. The timing of a coordinator too slow to answer within the
//! lease is tested under paused time with an in-memory coordinator (`src/supervisor/tests.rs`); reads stopping
//! against a real redis-server when the lease runs out, in `tests/faults.rs`.

mod common;

use common::{init_tracing, wait_status};
use protocol::messages::{ErrorResponse, HeartbeatRequest, HeartbeatResponse};
use protocol::names::MemberId;
use protocol::{AssignmentEpoch, MemberEpoch, MetadataVersion, RoutingVersion, ShardId, Status};
use std::time::Duration;
use stream_consumer::{Consumer, ConsumerBuilder, Message};
use test_support::RedisServer;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const HB_PATH: &str = "/v1/streams/orders/groups/billing/heartbeat";

fn answer(assigned: &[u32], lease_ms: u64) -> HeartbeatResponse {
    HeartbeatResponse {
        status: Status::Ok,
        member_id: MemberId::new("m1").unwrap(),
        incarnation: protocol::Incarnation(1),
        member_epoch: MemberEpoch(1),
        metadata_version: MetadataVersion(3),
        assignment_epoch: AssignmentEpoch(1),
        assigned: assigned.iter().map(|&s| ShardId(s)).collect(),
        fencing_tokens: vec![],
        pending: vec![],
        revoke: vec![],
        heartbeat_interval_ms: 200,
        assignment_lease_ms: lease_ms,
        shard_count: 8,
        routing_version: RoutingVersion(1),
    }
}

fn builder(redis_url: &str) -> ConsumerBuilder {
    Consumer::builder("orders", "billing")
        .redis(redis_url)
        .member_id("m1")
        .heartbeat_interval(Duration::from_millis(200))
        .member_ttl(Duration::from_millis(2000))
        .assignment_lease(Duration::from_millis(1500))
        .lease_safety_margin(Duration::from_millis(100))
        .request_timeout(Duration::from_millis(300))
        .read_block(Duration::from_millis(300))
}

async fn requests(server: &MockServer) -> Vec<HeartbeatRequest> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).expect("a heartbeat request body"))
        .collect()
}

#[tokio::test]
async fn a_group_that_was_never_created_stops_the_consumer_with_a_typed_error() {
    init_tracing();
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(ResponseTemplate::new(404).set_body_json(ErrorResponse {
            status: Status::NotFound,
            message: "group billing of stream orders was never created".into(),
            member_epoch: None,
            retry_after_ms: None,
        }))
        .mount(&server)
        .await;
    // A real Redis: the consumer checks it before joining.
    let redis = RedisServer::start().await;
    let consumer = builder(&redis.url())
        .coordinator(server.uri())
        .handler(|_m: Message| async { Ok::<_, std::io::Error>(()) })
        .build()
        .unwrap();
    let run = consumer.run(tokio_util::sync::CancellationToken::new());
    let err = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the consumer stops instead of retrying a group that does not exist")
        .unwrap_err();
    assert_eq!(err.coordinator_status(), Some(Status::NotFound), "{err}");
    assert_eq!(requests(&server).await.len(), 1, "no retry");
}

#[tokio::test]
async fn lost_join_answer_is_retried_as_a_join_of_the_same_instance() {
    init_tracing();
    let server = MockServer::start().await;
    // The join reaches the coordinator, but its answer comes after the client gave up.
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(answer(&[], 1500))
                .set_delay(Duration::from_secs(2)),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer(&[], 1500)))
        .with_priority(2)
        .mount(&server)
        .await;
    // A real Redis: the consumer checks it before joining (no shard is assigned, so nothing is read).
    let redis = RedisServer::start().await;
    let c = builder(&redis.url())
        .coordinator(server.uri())
        .handler(|_m: Message| async { Ok::<_, std::io::Error>(()) })
        .build()
        .unwrap()
        .spawn();
    wait_status(&c, Duration::from_secs(5), "joined", |s| {
        s.joined && s.heartbeats.ok >= 2
    })
    .await;
    let reqs = requests(&server).await;
    assert!(reqs.len() >= 3);
    assert_eq!(reqs[0].member_epoch, MemberEpoch::JOIN);
    assert_eq!(
        reqs[1].member_epoch,
        MemberEpoch::JOIN,
        "the lost join is retried as a join"
    );
    assert_eq!(
        reqs[0].instance_id, reqs[1].instance_id,
        "same instance: the coordinator sees a retry"
    );
    assert_eq!(reqs[2].member_epoch, MemberEpoch(1), "then the epoch of the answer");
    assert_eq!(reqs[2].metadata_version, MetadataVersion(3));
    let s = c.status();
    assert_eq!(s.heartbeats.failed, 1);
    assert_eq!(s.heartbeats.rejoins, 0);
    c.close().await.unwrap();
}

#[tokio::test]
async fn terminating_coordinator_then_success_on_the_next_url() {
    init_tracing();
    let terminating = MockServer::start().await;
    let healthy = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_json(ErrorResponse {
            status: Status::CoordinatorTerminating,
            message: "shutting down".into(),
            member_epoch: None,
            retry_after_ms: Some(200),
        }))
        .mount(&terminating)
        .await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer(&[], 1500)))
        .mount(&healthy)
        .await;
    // A real Redis: the consumer checks it before joining (no shard is assigned, so nothing is read).
    let redis = RedisServer::start().await;
    let c = builder(&redis.url())
        .coordinator(terminating.uri())
        .coordinator(healthy.uri())
        .handler(|_m: Message| async { Ok::<_, std::io::Error>(()) })
        .build()
        .unwrap()
        .spawn();
    wait_status(&c, Duration::from_secs(5), "three answered heartbeats", |s| {
        s.heartbeats.ok >= 3
    })
    .await;
    assert_eq!(c.status().heartbeats.failed, 0, "failed over within the same heartbeat");
    assert_eq!(
        requests(&terminating).await.len(),
        1,
        "the terminating instance is tried once, then skipped"
    );
    let healthy_reqs = requests(&healthy).await;
    assert!(healthy_reqs.len() >= 3);
    assert_eq!(healthy_reqs[0].member_epoch, MemberEpoch::JOIN);
    c.close().await.unwrap();
}

fn refusal(status: Status, retry_after_ms: u64) -> ResponseTemplate {
    ResponseTemplate::new(429)
        .insert_header("Retry-After", retry_after_ms.div_ceil(1000).to_string())
        .set_body_json(ErrorResponse {
            status,
            message: format!("refused: {status}"),
            member_epoch: None,
            retry_after_ms: Some(retry_after_ms),
        })
}

#[tokio::test]
async fn a_join_over_the_member_quota_stops_the_consumer_with_a_typed_error() {
    init_tracing();
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(refusal(Status::QuotaExceeded, 60_000))
        .mount(&server)
        .await;
    let redis = RedisServer::start().await;
    let consumer = builder(&redis.url())
        .coordinator(server.uri())
        .handler(|_m: Message| async { Ok::<_, std::io::Error>(()) })
        .build()
        .unwrap();
    let run = consumer.run(tokio_util::sync::CancellationToken::new());
    let err = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the consumer stops instead of retrying a join the quota refuses")
        .unwrap_err();
    assert_eq!(err.coordinator_status(), Some(Status::QuotaExceeded), "{err}");
    assert_eq!(requests(&server).await.len(), 1, "no retry");
}

#[tokio::test]
async fn a_rate_limited_join_is_retried_after_the_retry_after() {
    init_tracing();
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(refusal(Status::RateLimited, 800))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer(&[], 1500)))
        .with_priority(2)
        .mount(&server)
        .await;
    let redis = RedisServer::start().await;
    let c = builder(&redis.url())
        .coordinator(server.uri())
        .handler(|_m: Message| async { Ok::<_, std::io::Error>(()) })
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let c = c.spawn();
    wait_status(&c, Duration::from_secs(5), "joined", |s| s.joined).await;
    // Without the Retry-After the backoff (50 ms at first) would have joined at once.
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    let reqs = requests(&server).await;
    assert_eq!(reqs[0].member_epoch, MemberEpoch::JOIN);
    assert_eq!(reqs[1].member_epoch, MemberEpoch::JOIN);
    assert_eq!(c.status().heartbeats.failed, 1, "one refusal, not a retry loop");
    c.close().await.unwrap();
}
