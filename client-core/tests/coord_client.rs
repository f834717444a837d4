//! `CoordClient` against wiremock coordinators: a lost response, failover on `503 COORDINATOR_TERMINATING`, a
//! slow coordinator, and the statuses that must not fail over.

use client_core::{CoordClient, CoordError};
use protocol::messages::{ErrorResponse, HeartbeatRequest, HeartbeatResponse};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{AssignmentEpoch, MemberEpoch, MetadataVersion, RoutingVersion, Status};
use std::time::{Duration, Instant};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const HB_PATH: &str = "/v1/streams/orders/groups/billing/heartbeat";

fn names() -> (StreamName, GroupName) {
    (StreamName::new("orders").unwrap(), GroupName::new("billing").unwrap())
}

fn request() -> HeartbeatRequest {
    HeartbeatRequest {
        member_id: MemberId::new("m1").unwrap(),
        instance_id: "inst-1".into(),
        incarnation: protocol::Incarnation::NONE,
        member_epoch: MemberEpoch::JOIN,
        metadata_version: MetadataVersion(0),
        max_observed_version: MetadataVersion(0),
        owned: vec![],
        revoking: vec![],
        max_routing_version: protocol::RoutingVersion(0),
        max_shard_count: 0,
    }
}

fn answer() -> HeartbeatResponse {
    HeartbeatResponse {
        status: Status::Ok,
        member_id: MemberId::new("m1").unwrap(),
        incarnation: protocol::Incarnation(1),
        member_epoch: MemberEpoch(1),
        metadata_version: MetadataVersion(2),
        assignment_epoch: AssignmentEpoch(1),
        assigned: vec![],
        fencing_tokens: vec![],
        pending: vec![],
        revoke: vec![],
        heartbeat_interval_ms: 200,
        assignment_lease_ms: 1500,
        shard_count: 8,
        routing_version: RoutingVersion(1),
    }
}

fn error(status: Status, http: u16) -> ResponseTemplate {
    ResponseTemplate::new(http).set_body_json(ErrorResponse {
        status,
        message: format!("{status}"),
        member_epoch: None,
        retry_after_ms: None,
    })
}

async fn hits(server: &MockServer) -> usize {
    server.received_requests().await.map_or(0, |r| r.len())
}

#[tokio::test]
async fn lost_response_reached_the_server_and_the_retry_gets_the_answer() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(answer())
                .set_delay(Duration::from_secs(2)),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
        .with_priority(2)
        .mount(&server)
        .await;
    let client = CoordClient::new(vec![server.uri()], Duration::from_millis(300), None).unwrap();
    let (s, g) = names();

    let err = client.heartbeat(&s, &g, &request()).await.unwrap_err();
    assert!(matches!(err, CoordError::Unreachable { .. }), "{err}");
    assert!(err.is_retryable());
    assert!(!err.requires_rejoin());
    assert_eq!(
        hits(&server).await,
        1,
        "the request reached the coordinator; only its answer was lost"
    );

    // Heartbeats are idempotent: the same request again gets the recorded answer.
    let resp = client.heartbeat(&s, &g, &request()).await.unwrap();
    assert_eq!(resp, answer());
    assert_eq!(hits(&server).await, 2);
}

#[tokio::test]
async fn terminating_coordinator_then_success_on_the_next_url() {
    let terminating = MockServer::start().await;
    let healthy = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(error(Status::CoordinatorTerminating, 503))
        .mount(&terminating)
        .await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
        .mount(&healthy)
        .await;
    let client = CoordClient::new(vec![terminating.uri(), healthy.uri()], Duration::from_secs(1), None).unwrap();
    let (s, g) = names();

    let resp = client.heartbeat(&s, &g, &request()).await.unwrap();
    assert_eq!(resp.status, Status::Ok, "answered by the next URL within the same call");
    assert_eq!((hits(&terminating).await, hits(&healthy).await), (1, 1));

    // The next call goes straight to the URL that worked.
    client.heartbeat(&s, &g, &request()).await.unwrap();
    assert_eq!((hits(&terminating).await, hits(&healthy).await), (1, 2));
}

#[tokio::test]
async fn every_url_terminating_is_a_retryable_status_error() {
    let a = MockServer::start().await;
    let b = MockServer::start().await;
    for server in [&a, &b] {
        Mock::given(method("POST"))
            .respond_with(error(Status::CoordinatorTerminating, 503))
            .mount(server)
            .await;
    }
    let client = CoordClient::new(vec![a.uri(), b.uri()], Duration::from_secs(1), None).unwrap();
    let (s, g) = names();
    let err = client.heartbeat(&s, &g, &request()).await.unwrap_err();
    assert_eq!(err.status(), Some(Status::CoordinatorTerminating));
    assert!(err.is_retryable());
    assert_eq!((hits(&a).await, hits(&b).await), (1, 1));
}

#[tokio::test]
async fn slow_coordinator_is_a_timeout_error_after_the_configured_deadline() {
    let slow = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(answer())
                .set_delay(Duration::from_secs(5)),
        )
        .mount(&slow)
        .await;
    let client = CoordClient::new(vec![slow.uri()], Duration::from_millis(300), None).unwrap();
    let (s, g) = names();
    let started = Instant::now();
    let err = client.heartbeat(&s, &g, &request()).await.unwrap_err();
    let took = started.elapsed();
    match &err {
        CoordError::Unreachable { source, .. } => assert!(source.is_timeout(), "{source}"),
        other => panic!("expected a timeout, got {other}"),
    }
    assert!(err.is_retryable());
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "gave up after {took:?}, the timeout is 300 ms"
    );
}

#[tokio::test]
async fn slow_coordinator_fails_over_to_the_next_url() {
    let slow = MockServer::start().await;
    let healthy = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(answer())
                .set_delay(Duration::from_secs(5)),
        )
        .mount(&slow)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
        .mount(&healthy)
        .await;
    let client = CoordClient::new(vec![slow.uri(), healthy.uri()], Duration::from_millis(300), None).unwrap();
    let (s, g) = names();
    let resp = client.heartbeat(&s, &g, &request()).await.unwrap();
    assert_eq!(resp.status, Status::Ok);
}

#[tokio::test]
async fn fenced_and_unknown_member_are_answers_not_failover_reasons() {
    for (status, http) in [(Status::FencedMemberEpoch, 409), (Status::UnknownMember, 409)] {
        let first = MockServer::start().await;
        let second = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(error(status, http))
            .mount(&first)
            .await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
            .mount(&second)
            .await;
        let client = CoordClient::new(vec![first.uri(), second.uri()], Duration::from_secs(1), None).unwrap();
        let (s, g) = names();
        let err = client.heartbeat(&s, &g, &request()).await.unwrap_err();
        assert_eq!(err.status(), Some(status));
        assert!(err.requires_rejoin());
        assert!(!err.is_retryable());
        assert_eq!(hits(&second).await, 0, "{status}: the coordinator's answer stands");
    }
}

#[tokio::test]
async fn unreachable_urls_are_skipped() {
    let healthy = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
        .mount(&healthy)
        .await;
    // Port 1 on loopback refuses connections.
    let client = CoordClient::new(
        vec!["http://127.0.0.1:1".into(), healthy.uri()],
        Duration::from_secs(1),
        None,
    )
    .unwrap();
    let (s, g) = names();
    assert_eq!(client.heartbeat(&s, &g, &request()).await.unwrap().status, Status::Ok);
}

#[tokio::test]
async fn refused_tokens_are_typed_final_answers_sent_with_the_bearer_token() {
    use wiremock::matchers::header;
    for http in [401, 403] {
        let first = MockServer::start().await;
        let second = MockServer::start().await;
        Mock::given(method("POST"))
            .and(header("authorization", "Bearer tenant-a-consumer"))
            .respond_with(ResponseTemplate::new(http).set_body_json(ErrorResponse {
                status: Status::Unauthorized,
                message: "the bearer token's consumer role does not cover stream \"orders\"".into(),
                member_epoch: None,
                retry_after_ms: None,
            }))
            .mount(&first)
            .await;
        let client = CoordClient::new(
            vec![first.uri(), second.uri()],
            Duration::from_secs(1),
            Some("tenant-a-consumer".into()),
        )
        .unwrap();
        let (s, g) = names();
        let err = client.heartbeat(&s, &g, &request()).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::Unauthorized), "{http}: {err}");
        assert!(!err.is_retryable(), "{http}");
        assert!(err.to_string().contains("does not cover stream"), "{err}");
        assert_eq!(hits(&first).await, 1, "{http}: the token was sent");
        assert_eq!(hits(&second).await, 0, "{http}: a refusal is not a failover reason");
    }
}

#[test]
fn configuration_errors_are_typed_and_final() {
    let t = Duration::from_secs(1);
    let none = CoordClient::new(vec![], t, None).unwrap_err();
    assert!(matches!(none, CoordError::NoUrl), "{none:?}");
    let bad = CoordClient::new(vec!["http://ok".into(), "ftp://coord".into()], t, None).unwrap_err();
    assert!(
        matches!(&bad, CoordError::InvalidUrl(u) if u == "ftp://coord"),
        "{bad:?}"
    );
    assert!(!none.is_retryable() && !bad.is_retryable());
    assert_eq!(
        client_core::coord_client::first_invalid_url(&["https://a".into(), "b".into()]),
        Some("b")
    );
}

#[tokio::test]
async fn quota_refusals_are_typed_and_carry_the_retry_after() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "1")
                .set_body_json(ErrorResponse {
                    status: Status::RateLimited,
                    message: "token t sent more than its 5 requests per second".into(),
                    member_epoch: None,
                    retry_after_ms: Some(700),
                }),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(HB_PATH))
        .respond_with(ResponseTemplate::new(429).set_body_json(ErrorResponse {
            status: Status::QuotaExceeded,
            message: "group billing holds 2 members".into(),
            member_epoch: None,
            retry_after_ms: Some(60_000),
        }))
        .with_priority(2)
        .mount(&server)
        .await;
    let client = CoordClient::new(vec![server.uri()], Duration::from_secs(2), None).unwrap();
    let (s, g) = names();
    let limited = client.heartbeat(&s, &g, &request()).await.unwrap_err();
    assert_eq!(limited.status(), Some(Status::RateLimited));
    assert_eq!(limited.retry_after(), Some(Duration::from_millis(700)));
    assert!(limited.is_retryable() && !limited.is_quota_exceeded());
    let full = client.heartbeat(&s, &g, &request()).await.unwrap_err();
    assert!(full.is_quota_exceeded() && !full.is_retryable(), "{full}");
    assert_eq!(hits(&server).await, 2, "a 429 never fails over to another URL");
}
