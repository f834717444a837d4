//! The coordinator's admin API over HTTP: a typed client of one coordinator URL, with the errors a caller can
//! act on.
//!
//! One method per admin route: create, describe and recreate a group, list groups, read a stream's routing, add
//! shards, fence a member, and the `/metrics` text. `coordctl`, the demo and the tests use this client.
//!
//! ```no_run
//! # async fn example() -> Result<(), client_core::admin::AdminError> {
//! use client_core::admin::AdminClient;
//! use protocol::messages::CreateGroupRequest;
//! use std::time::Duration;
//!
//! let admin = AdminClient::new("http://127.0.0.1:7400", None, Duration::from_secs(5))?;
//! let req = CreateGroupRequest { shard_count: Some(8), timings: None };
//! let group = admin.create("orders", "billing", &req).await?;
//! println!("{} shards", group.shards.len());
//! # Ok(())
//! # }
//! ```

use protocol::messages::{
    AddShardsRequest, CreateGroupRequest, ErrorResponse, GroupDescription, GroupList, QuotaDescription,
    RecreateGroupRequest, RoutingDescription,
};
use protocol::{routes, StoreRevision};
use redis_link::TlsOptions;
use reqwest::header::{AUTHORIZATION, IF_MATCH};
use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use std::time::Duration;
use thiserror::Error;

use crate::coord_tls::{http_client, tls_failure, HttpClientError};

/// Why an admin call failed.
#[derive(Debug, Error)]
pub enum AdminError {
    /// The coordinator answered with an error (its typed body): the request was refused and changed nothing
    /// unless the body says otherwise.
    #[error("{} (HTTP {http}): {}", .body.status, .body.message)]
    Api {
        /// The HTTP status code.
        http: u16,
        /// The coordinator's error body.
        body: ErrorResponse,
    },
    /// No answer: connection refused, reset, timeout.
    #[error("cannot reach the coordinator at {url}: {source}")]
    Transport {
        /// The URL tried (credentials redacted).
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The TLS handshake failed (the coordinator's certificate is not trusted or not for this name, or it refused
    /// this client's certificate): retrying does not help until the certificates change.
    #[error("TLS to the coordinator at {url} failed: {reason}")]
    Tls {
        /// The URL tried (credentials redacted).
        url: String,
        /// rustls's reason (for example `invalid peer certificate: UnknownIssuer`).
        reason: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// An answer that is not the coordinator's JSON (a proxy, another service, a version mismatch).
    #[error("unexpected answer from {url} (HTTP {http}): {detail}")]
    Decode {
        /// The URL (credentials redacted).
        url: String,
        /// The HTTP status code.
        http: u16,
        /// What was wrong.
        detail: String,
    },
    /// The HTTP client could not be built: a TLS file that cannot be read, settings the HTTP stack refused (no
    /// request was sent).
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] HttpClientError),
}

impl AdminError {
    /// The HTTP status and typed body of a refusal ([`AdminError::Api`]); `None` for the other errors.
    pub fn refusal(&self) -> Option<(u16, &ErrorResponse)> {
        match self {
            AdminError::Api { http, body } => Some((*http, body)),
            _ => None,
        }
    }
}

/// A client of one coordinator's admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    /// Base URL without a trailing slash.
    base: String,
    /// Admin bearer token, sent when set.
    token: Option<String>,
    /// Kept so [`AdminClient::coordinator_tls`] can build the HTTP client again.
    timeout: Duration,
    http: reqwest::Client,
}

impl AdminClient {
    /// A client for `base` (for example `http://127.0.0.1:7400`) with an admin bearer token (`None` or empty:
    /// none sent) and a per-request timeout.
    ///
    /// # Errors
    /// [`AdminError::Client`] when the HTTP client cannot be built.
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Self, AdminError> {
        let http = http_client(timeout, None, &TlsOptions::default()).map_err(AdminError::Client)?;
        Ok(AdminClient {
            base: base.trim_end_matches('/').to_owned(),
            token: token.filter(|t| !t.is_empty()),
            timeout,
            http,
        })
    }

    /// The same client with `tls` for an `https://` base URL (a private CA, a client certificate); without it
    /// the server is verified against the system's roots.
    ///
    /// # Errors
    /// [`AdminError::Client`] when a TLS file cannot be read or the settings are refused.
    pub fn coordinator_tls(self, tls: TlsOptions) -> Result<Self, AdminError> {
        let http = http_client(self.timeout, None, &tls).map_err(AdminError::Client)?;
        Ok(AdminClient { http, ..self })
    }

    /// The base URL, without a trailing slash.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET /v1/groups[?rebuild=true]`: every group the coordinator knows (`rebuild`: rebuilt from a scan of
    /// Redis first).
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn list_groups(&self, rebuild: bool) -> Result<GroupList, AdminError> {
        let path = routes::groups(rebuild);
        self.json(self.request(Method::GET, &path)).await
    }

    /// `GET /v1/quota`: the quotas of this client's token and how much of each it uses.
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn quota(&self) -> Result<QuotaDescription, AdminError> {
        self.json(self.request(Method::GET, routes::QUOTA)).await
    }

    /// `GET /v1/streams/{stream}/groups/{group}`.
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn describe(&self, stream: &str, group: &str) -> Result<GroupDescription, AdminError> {
        let path = routes::group(stream, group);
        self.json(self.request(Method::GET, &path)).await
    }

    /// `GET /v1/streams/{stream}`: the stream's routing (shard count, version, revision).
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn routing(&self, stream: &str) -> Result<RoutingDescription, AdminError> {
        let path = routes::stream(stream);
        self.json(self.request(Method::GET, &path)).await
    }

    /// `POST /v1/streams/{stream}/shards`: adds `count` shards, only at revision `if_match` when given.
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn add_shards(
        &self,
        stream: &str,
        count: u32,
        if_match: Option<StoreRevision>,
    ) -> Result<RoutingDescription, AdminError> {
        let path = routes::shards(stream);
        let rb = with_if_match(self.request(Method::POST, &path), if_match).json(&AddShardsRequest { count });
        self.json(rb).await
    }

    /// `POST /v1/streams/{stream}/groups/{group}/members/{member}/fence`, only at revision `if_match` when
    /// given.
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn fence(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        if_match: Option<StoreRevision>,
    ) -> Result<GroupDescription, AdminError> {
        let path = routes::fence(stream, group, member);
        self.json(with_if_match(self.request(Method::POST, &path), if_match))
            .await
    }

    /// `POST /v1/streams/{stream}/groups/{group}`: creates a group (and the stream's routing when it has none).
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn create(
        &self,
        stream: &str,
        group: &str,
        req: &CreateGroupRequest,
    ) -> Result<GroupDescription, AdminError> {
        let path = routes::group(stream, group);
        self.json(self.request(Method::POST, &path).json(req)).await
    }

    /// `POST /v1/streams/{stream}/groups/{group}/recreate`.
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn recreate(
        &self,
        stream: &str,
        group: &str,
        req: &RecreateGroupRequest,
    ) -> Result<GroupDescription, AdminError> {
        let path = routes::recreate(stream, group);
        self.json(self.request(Method::POST, &path).json(req)).await
    }

    /// `GET /metrics` as text (`None` when the coordinator does not serve it or does not answer).
    pub async fn metrics(&self) -> Option<String> {
        let resp = self.request(Method::GET, "/metrics").send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let rb = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => rb.header(AUTHORIZATION, format!("Bearer {t}")),
            None => rb,
        }
    }

    async fn json<T: DeserializeOwned>(&self, rb: RequestBuilder) -> Result<T, AdminError> {
        let resp = rb.send().await.map_err(|source| {
            let url = protocol::redact::redact_url(&self.base);
            match tls_failure(&source) {
                Some(reason) => AdminError::Tls { url, reason, source },
                None => AdminError::Transport { url, source },
            }
        })?;
        decode(resp).await
    }
}

fn with_if_match(rb: RequestBuilder, if_match: Option<StoreRevision>) -> RequestBuilder {
    match if_match {
        Some(rev) => rb.header(IF_MATCH, format!("\"{}\"", rev.0)),
        None => rb,
    }
}

async fn decode<T: DeserializeOwned>(resp: Response) -> Result<T, AdminError> {
    let url = protocol::redact::redact_url(resp.url().as_str());
    let http = resp.status().as_u16();
    let text = resp.text().await.map_err(|source| AdminError::Transport {
        url: url.clone(),
        source,
    })?;
    if (200..300).contains(&http) {
        return serde_json::from_str(&text).map_err(|e| AdminError::Decode {
            url,
            http,
            detail: format!("{e}: {}", excerpt(&text)),
        });
    }
    match serde_json::from_str::<ErrorResponse>(&text) {
        Ok(body) => Err(AdminError::Api { http, body }),
        Err(_) => Err(AdminError::Decode {
            url,
            http,
            detail: excerpt(&text),
        }),
    }
}

/// At most 200 characters of an answer, for an error message.
fn excerpt(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(routes::stream("orders"), "/v1/streams/orders");
        assert_eq!(routes::stream("a b/c"), "/v1/streams/a%20b%2Fc");
    }

    #[test]
    fn long_answers_are_cut_in_errors() {
        let long = "x".repeat(500);
        assert_eq!(excerpt(&long).chars().count(), 201);
        assert_eq!(excerpt(" short "), "short");
    }

    #[tokio::test]
    async fn a_refusal_is_typed_and_other_answers_are_decode_errors() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/streams/s/shards"))
            .and(header("if-match", "\"7\""))
            .and(header("authorization", "Bearer t"))
            .respond_with(ResponseTemplate::new(412).set_body_json(serde_json::json!({
                "status": "REVISION_CONFLICT",
                "message": "stale revision",
            })))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/streams/s"))
            .respond_with(ResponseTemplate::new(502).set_body_string("<html>bad gateway</html>"))
            .mount(&server)
            .await;
        let admin =
            AdminClient::new(&format!("{}/", server.uri()), Some("t".into()), Duration::from_secs(5)).expect("client");
        let e = admin.add_shards("s", 1, Some(StoreRevision(7))).await.unwrap_err();
        let (http, body) = e.refusal().expect("a typed refusal");
        assert_eq!((http, body.status), (412, protocol::Status::RevisionConflict));
        match admin.routing("s").await.unwrap_err() {
            AdminError::Decode { http, detail, .. } => {
                assert_eq!((http, detail.as_str()), (502, "<html>bad gateway</html>"))
            }
            other => panic!("expected a decode error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn nothing_listening_is_a_transport_error() {
        let port = test_support::free_port();
        let admin = AdminClient::new(&format!("http://127.0.0.1:{port}"), None, Duration::from_secs(2)).unwrap();
        assert!(matches!(
            admin.list_groups(false).await,
            Err(AdminError::Transport { .. })
        ));
    }
}
