//! Level 2: the wire-level client. Scenarios craft heartbeats themselves; admin calls go through the SDK's
//! [`client_core::admin::AdminClient`].

use super::*;
use client_core::admin::{AdminClient, AdminError};
use protocol::StoreRevision;

/// A client of one coordinator URL speaking the wire types.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

/// An error answer: HTTP status and typed body.
pub type Refusal = (StatusCode, ErrorResponse);

impl Api {
    pub fn new(base: impl Into<String>) -> Self {
        Api {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("http client"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends and decodes: `Ok` for 2xx, `Err` with the typed error otherwise; panics when nothing answers.
    pub async fn send<T: serde::de::DeserializeOwned>(&self, rb: reqwest::RequestBuilder) -> Result<T, Refusal> {
        let resp = rb.send().await.expect("the coordinator answers");
        decode(resp).await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics answered")
            .text()
            .await
            .expect("metrics body")
    }
}

/// An admin answer as a [`Refusal`]; panics when nothing (usable) answers.
pub fn refusal<T>(r: Result<T, AdminError>) -> Result<T, Refusal> {
    r.map_err(|e| match e {
        AdminError::Api { http, body } => (StatusCode::from_u16(http).expect("an HTTP status"), body),
        other => panic!("the coordinator answers: {other}"),
    })
}

pub async fn decode<T: serde::de::DeserializeOwned>(resp: reqwest::Response) -> Result<T, Refusal> {
    let status = resp.status();
    let text = resp.text().await.expect("body");
    if status.is_success() {
        Ok(serde_json::from_str(&text).unwrap_or_else(|e| panic!("cannot decode {text}: {e}")))
    } else {
        let body: ErrorResponse =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not an ErrorResponse ({status}): {text}: {e}"));
        Err((status, body))
    }
}

/// A wire client bound to the scenario's group.
#[derive(Clone)]
pub struct GroupApi {
    pub api: Api,
    pub stream: String,
    pub group: String,
}

impl GroupApi {
    pub fn heartbeat_request(&self, req: &HeartbeatRequest) -> reqwest::RequestBuilder {
        self.api
            .http
            .post(self.api.url(&protocol::routes::heartbeat(&self.stream, &self.group)))
            .json(req)
    }

    pub async fn heartbeat(&self, req: &HeartbeatRequest) -> Result<HeartbeatResponse, Refusal> {
        self.api.send(self.heartbeat_request(req)).await
    }

    /// A heartbeat that must be answered 200.
    pub async fn hb(&self, req: &HeartbeatRequest) -> HeartbeatResponse {
        match self.heartbeat(req).await {
            Ok(r) => r,
            Err((status, body)) => panic!("heartbeat {req:?} refused: {status} {body:?}"),
        }
    }

    /// Retries a heartbeat while the answer is a retryable 503 (a mutex left by a dead section, a restart).
    pub async fn hb_retrying(&self, req: &HeartbeatRequest) -> Result<HeartbeatResponse, Refusal> {
        let answered = test_support::poll_every(Duration::from_millis(50), DEADLINE, || async {
            match self.heartbeat(req).await {
                Err((status, _)) if status == StatusCode::SERVICE_UNAVAILABLE => None,
                other => Some(other),
            }
        })
        .await;
        match answered {
            Some(answer) => answer,
            // Still refused at the deadline: that refusal is the answer.
            None => self.heartbeat(req).await,
        }
    }

    /// The SDK's admin client for this coordinator (create, describe, recreate, fence, add shards, routing).
    pub fn admin(&self) -> AdminClient {
        AdminClient::new(&self.api.base, None, Duration::from_secs(5)).expect("admin client")
    }

    pub async fn describe(&self) -> Result<GroupDescription, Refusal> {
        refusal(self.admin().describe(&self.stream, &self.group).await)
    }

    pub async fn create(&self, shards: u32) -> Result<GroupDescription, Refusal> {
        let req = CreateGroupRequest {
            shard_count: Some(shards),
            timings: Some(timings()),
        };
        refusal(self.admin().create(&self.stream, &self.group, &req).await)
    }

    pub async fn recreate(&self, shards: u32) -> Result<GroupDescription, Refusal> {
        let req = RecreateGroupRequest {
            confirm: true,
            shard_count: shards,
            timings: Some(timings()),
        };
        refusal(self.admin().recreate(&self.stream, &self.group, &req).await)
    }

    pub async fn fence(&self, member: &str, if_match: Option<u64>) -> Result<GroupDescription, Refusal> {
        let admin = self.admin();
        refusal(
            admin
                .fence(&self.stream, &self.group, member, if_match.map(StoreRevision))
                .await,
        )
    }

    pub async fn add_shards(
        &self,
        count: u32,
        if_match: Option<u64>,
    ) -> Result<protocol::messages::RoutingDescription, Refusal> {
        refusal(
            self.admin()
                .add_shards(&self.stream, count, if_match.map(StoreRevision))
                .await,
        )
    }

    pub async fn describe_routing(&self) -> Result<protocol::messages::RoutingDescription, Refusal> {
        refusal(self.admin().routing(&self.stream).await)
    }

    pub async fn routing(
        &self,
        version: u64,
        max_observed: u64,
    ) -> Result<protocol::messages::RoutingResponse, Refusal> {
        self.api
            .send(self.api.http.get(self.api.url(&format!(
                "{}?routingVersion={version}&maxObservedVersion={max_observed}",
                protocol::routes::routing(&self.stream)
            ))))
            .await
    }
}
