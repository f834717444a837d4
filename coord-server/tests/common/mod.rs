//! Shared helpers of the coordinator's integration tests: a real `redis-server`, the coordinator in-process on
//! `127.0.0.1:0`, and a small HTTP client speaking the wire types.
#![allow(dead_code)] // each test binary uses a different subset

use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use protocol::keys;
use protocol::messages::{CreateGroupRequest, ErrorResponse, GroupDescription, HeartbeatRequest, HeartbeatResponse};
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{MemberEpoch, MetadataVersion, ShardId, Status};
use reqwest::{Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use test_support::RedisServer;

/// The short group timings of every suite (`test_support::timings`): expiry and leases play out within a test.
pub fn timings() -> GroupTimings {
    test_support::timings::group_timings()
}

/// The test coordinator configuration (`test_support::coordinator`) for `redis_url` on a free port: short
/// timings, a 50 ms tick, and a mutex TTL and section timeout the 1.5 s assignment lease accepts
/// (`Config::check_timings`).
pub fn config(redis_url: &str) -> Config {
    test_support::coordinator::config(redis_url, test_support::coordinator::any_port())
}

/// A real Redis and a coordinator on it.
pub async fn start() -> (RedisServer, CoordinatorHandle) {
    let redis = RedisServer::start().await;
    let coord = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect("coordinator starts");
    (redis, coord)
}

/// As [`start`], on a Redis with an append-only file: [`RedisServer::restart`] keeps the data under a new run id
/// (what a coordinator sees after a failover or a restore).
pub async fn start_persistent() -> (RedisServer, CoordinatorHandle) {
    let redis = RedisServer::builder().persistence(true).start().await;
    let coord = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect("coordinator starts");
    (redis, coord)
}

/// A client for one coordinator URL, with an optional bearer token.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
}

impl Api {
    pub fn new(base: impl Into<String>) -> Self {
        Api {
            base: base.into(),
            http: reqwest::Client::new(),
            token: None,
        }
    }

    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    pub async fn get(&self, path: &str) -> Response {
        self.auth(self.http.get(format!("{}{path}", self.base)))
            .send()
            .await
            .expect("request sent")
    }

    pub async fn post<B: Serialize>(&self, path: &str, body: &B) -> Response {
        self.auth(self.http.post(format!("{}{path}", self.base)).json(body))
            .send()
            .await
            .expect("request sent")
    }

    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.auth(self.http.request(method, format!("{}{path}", self.base)))
    }

    pub async fn create_group(&self, stream: &str, group: &str, shards: u32) -> GroupDescription {
        self.create_group_with(stream, group, shards, timings()).await
    }

    pub async fn create_group_with(
        &self,
        stream: &str,
        group: &str,
        shards: u32,
        timings: GroupTimings,
    ) -> GroupDescription {
        let req = CreateGroupRequest {
            shard_count: Some(shards),
            timings: Some(timings),
        };
        let resp = self.post(&protocol::routes::group(stream, group), &req).await;
        ok_json(resp, StatusCode::CREATED).await
    }

    pub async fn describe(&self, stream: &str, group: &str) -> GroupDescription {
        ok_json(self.get(&protocol::routes::group(stream, group)).await, StatusCode::OK).await
    }

    /// Sends a heartbeat; `Ok` for a 200 answer, `Err` with the HTTP status and typed body otherwise.
    pub async fn heartbeat(
        &self,
        stream: &str,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, (StatusCode, ErrorResponse)> {
        let resp = self.post(&protocol::routes::heartbeat(stream, group), req).await;
        let status = resp.status();
        if status == StatusCode::OK {
            Ok(resp.json().await.expect("HeartbeatResponse body"))
        } else {
            Err((status, resp.json().await.expect("ErrorResponse body")))
        }
    }

    /// A heartbeat that must be answered 200.
    pub async fn hb(&self, stream: &str, group: &str, req: &HeartbeatRequest) -> HeartbeatResponse {
        match self.heartbeat(stream, group, req).await {
            Ok(r) => r,
            Err((status, body)) => panic!("heartbeat {req:?} refused: {status} {body:?}"),
        }
    }
}

/// Asserts the HTTP status and decodes the body.
pub async fn ok_json<T: DeserializeOwned>(resp: Response, expected: StatusCode) -> T {
    let status = resp.status();
    let text = resp.text().await.expect("body");
    assert_eq!(status, expected, "unexpected answer: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("cannot decode {text}: {e}"))
}

/// Asserts an error answer: HTTP status, JSON content type and typed body with `wire` status.
pub async fn error_json(resp: Response, http: StatusCode, wire: Status) -> ErrorResponse {
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = resp.text().await.expect("body");
    assert_eq!(status, http, "unexpected answer: {text}");
    assert!(
        content_type.starts_with("application/json"),
        "content type {content_type:?}: {text}"
    );
    let body: ErrorResponse =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not an ErrorResponse: {text}: {e}"));
    assert_eq!(body.status, wire, "{text}");
    body
}

/// Timings for a coordinator that waits 8 s for a mutex with a 10 s TTL (tests that hold the mutex themselves):
/// its assignment lease must outlast both.
pub fn patient_timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: 20_000,
        heartbeat_interval_ms: 200,
        rebalance_timeout_ms: 20_000,
        assignment_lease_ms: 18_000,
    }
}

/// A join request (epoch 0) from instance `<member>-i`.
pub fn join(member: &str) -> HeartbeatRequest {
    HeartbeatRequest {
        member_id: MemberId::new(member).expect("valid member id"),
        instance_id: format!("{member}-i"),
        incarnation: protocol::Incarnation::NONE,
        member_epoch: MemberEpoch::JOIN,
        metadata_version: MetadataVersion(0),
        max_observed_version: MetadataVersion(0),
        owned: Vec::new(),
        revoking: Vec::new(),
        max_routing_version: protocol::RoutingVersion(0),
        max_shard_count: 0,
    }
}

/// The heartbeat a well-behaved consumer sends after applying `last`: it reads what it may read and acks the
/// shards it was told to drain as `REVOKED` (no in-flight work in these tests). Built by the SDK's own rules
/// (`client_core::membership`) from that state.
pub fn follow_up(last: &HeartbeatResponse, reading: &[ShardId]) -> HeartbeatRequest {
    client_core::membership::Membership::resume(
        last.member_id.clone(),
        format!("{}-i", last.member_id),
        last.metadata_version,
        client_core::membership::Standing {
            incarnation: last.incarnation,
            epoch: last.member_epoch,
            metadata_version: last.metadata_version,
        },
        [reading, &[], &last.revoke],
    )
    .request()
}

/// What a consumer reads after applying `resp` while it was reading `reading`: `OK` starts every assigned
/// shard; the other statuses only keep assigned shards already being read.
pub fn reading_after(resp: &HeartbeatResponse, reading: &[ShardId]) -> Vec<ShardId> {
    if resp.status == Status::Ok {
        resp.assigned.clone()
    } else {
        reading.iter().copied().filter(|s| resp.assigned.contains(s)).collect()
    }
}

pub fn shards(ids: &[u32]) -> Vec<ShardId> {
    ids.iter().map(|&i| ShardId(i)).collect()
}

fn names(stream: &str, group: &str) -> (StreamName, GroupName) {
    (
        StreamName::new(stream).expect("valid stream"),
        GroupName::new(group).expect("valid group"),
    )
}

pub fn metadata_key(stream: &str, group: &str) -> String {
    let (s, g) = names(stream, group);
    keys::group_metadata(&s, &g)
}

pub fn mutex_key(stream: &str, group: &str) -> String {
    let (s, g) = names(stream, group);
    keys::group_mutex(&s, &g)
}

pub fn liveness_key(stream: &str, group: &str) -> String {
    let (s, g) = names(stream, group);
    keys::group_liveness(&s, &g)
}
