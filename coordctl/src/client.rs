//! The admin API over HTTP: one method per route `coordctl` uses, and the errors a caller can act on.

use protocol::messages::{
    AddShardsRequest, CreateGroupRequest, ErrorResponse, GroupDescription, GroupList, RecreateGroupRequest,
    RoutingDescription,
};
use protocol::{routes, StoreRevision};
use reqwest::header::{AUTHORIZATION, IF_MATCH};
use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;
use thiserror::Error;

/// Why a command failed; [`CliError::exit_code`] is the process exit status.
#[derive(Debug, Error)]
pub enum CliError {
    /// The coordinator answered with an error (its typed body).
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
        /// The URL tried.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// An answer that is not the coordinator's JSON (a proxy, another service, a version mismatch).
    #[error("unexpected answer from {url} (HTTP {http}): {detail}")]
    Decode {
        /// The URL.
        url: String,
        /// The HTTP status code.
        http: u16,
        /// What was wrong.
        detail: String,
    },
    /// `coordctl` itself refused (a confirmation missing, inconsistent flags).
    #[error("{0}")]
    Refused(String),
}

impl CliError {
    /// The exit status: 1 the coordinator refused or failed, 3 no usable answer, 4 refused by `coordctl`.
    /// (2 is clap's usage error.)
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Api { .. } => 1,
            CliError::Transport { .. } | CliError::Decode { .. } => 3,
            CliError::Refused(_) => 4,
        }
    }
}

/// A client of one coordinator.
pub struct AdminClient {
    /// Base URL without a trailing slash.
    base: String,
    /// Admin bearer token, sent when set.
    token: Option<String>,
    http: reqwest::Client,
}

impl AdminClient {
    /// A client for `base` (for example `http://127.0.0.1:7400`) with a per-request timeout.
    ///
    /// # Errors
    /// [`CliError::Refused`] when the HTTP client cannot be built.
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Self, CliError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| CliError::Refused(format!("cannot build the HTTP client: {e}")))?;
        Ok(AdminClient {
            base: base.trim_end_matches('/').to_owned(),
            token: token.filter(|t| !t.is_empty()),
            http,
        })
    }

    /// `GET /v1/groups[?rebuild=true]`.
    pub async fn groups(&self, rebuild: bool) -> Result<GroupList, CliError> {
        let path = routes::groups(rebuild);
        self.json(self.request(Method::GET, &path)).await
    }

    /// `GET /v1/streams/{stream}/groups/{group}`.
    pub async fn describe(&self, stream: &str, group: &str) -> Result<GroupDescription, CliError> {
        let path = routes::group(stream, group);
        self.json(self.request(Method::GET, &path)).await
    }

    /// `GET /v1/streams/{stream}`.
    pub async fn routing(&self, stream: &str) -> Result<RoutingDescription, CliError> {
        let path = routes::stream(stream);
        self.json(self.request(Method::GET, &path)).await
    }

    /// `POST /v1/streams/{stream}/shards`.
    pub async fn add_shards(
        &self,
        stream: &str,
        count: u32,
        if_match: Option<StoreRevision>,
    ) -> Result<RoutingDescription, CliError> {
        let path = routes::shards(stream);
        let rb = with_if_match(self.request(Method::POST, &path), if_match).json(&AddShardsRequest { count });
        self.json(rb).await
    }

    /// `POST /v1/streams/{stream}/groups/{group}/members/{member}/fence`.
    pub async fn fence(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        if_match: Option<StoreRevision>,
    ) -> Result<GroupDescription, CliError> {
        let path = routes::fence(stream, group, member);
        self.json(with_if_match(self.request(Method::POST, &path), if_match))
            .await
    }

    /// `POST /v1/streams/{stream}/groups/{group}`: create a group (and the stream's routing when it has none).
    pub async fn create(
        &self,
        stream: &str,
        group: &str,
        req: &CreateGroupRequest,
    ) -> Result<GroupDescription, CliError> {
        let path = routes::group(stream, group);
        self.json(body(self.request(Method::POST, &path), req)).await
    }

    /// `POST /v1/streams/{stream}/groups/{group}/recreate`.
    pub async fn recreate(
        &self,
        stream: &str,
        group: &str,
        req: &RecreateGroupRequest,
    ) -> Result<GroupDescription, CliError> {
        let path = routes::recreate(stream, group);
        self.json(body(self.request(Method::POST, &path), req)).await
    }

    /// `GET /metrics` as text, for the per-shard lag (`None` when the coordinator does not serve it).
    pub async fn metrics(&self) -> Option<String> {
        let resp = self.request(Method::GET, routes::METRICS).send().await.ok()?;
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

    async fn json<T: DeserializeOwned>(&self, rb: RequestBuilder) -> Result<T, CliError> {
        let resp = rb.send().await.map_err(|source| CliError::Transport {
            url: protocol::redact::redact_url(&self.base),
            source,
        })?;
        decode(resp).await
    }
}

/// `err` and its causes, `: `-separated, each said once: a cause whose text the message so far already contains
/// (reqwest, hyper and the OS error often repeat one another) is left out.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

fn body<T: Serialize>(rb: RequestBuilder, value: &T) -> RequestBuilder {
    rb.json(value)
}

fn with_if_match(rb: RequestBuilder, if_match: Option<StoreRevision>) -> RequestBuilder {
    match if_match {
        Some(rev) => rb.header(IF_MATCH, format!("\"{}\"", rev.0)),
        None => rb,
    }
}

async fn decode<T: DeserializeOwned>(resp: Response) -> Result<T, CliError> {
    let url = protocol::redact::redact_url(resp.url().as_str());
    let http = resp.status().as_u16();
    let text = resp.text().await.map_err(|source| CliError::Transport {
        url: url.clone(),
        source,
    })?;
    if (200..300).contains(&http) {
        return serde_json::from_str(&text).map_err(|e| CliError::Decode {
            url,
            http,
            detail: format!("{e}: {}", excerpt(&text)),
        });
    }
    match serde_json::from_str::<ErrorResponse>(&text) {
        Ok(body) => Err(CliError::Api { http, body }),
        Err(_) => Err(CliError::Decode {
            url,
            http,
            detail: excerpt(&text),
        }),
    }
}

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

    #[derive(Debug, Error)]
    #[error("{0}")]
    struct Layer(String, #[source] Option<Box<Layer>>);

    fn layers(texts: &[&str]) -> Layer {
        texts
            .iter()
            .rev()
            .fold(None, |inner, t| Some(Layer((*t).to_owned(), inner.map(Box::new))))
            .expect("at least one layer")
    }

    #[test]
    fn each_cause_is_printed_once() {
        let e = layers(&[
            "cannot reach the coordinator at http://x",
            "error sending request",
            "client error (Connect)",
            "tcp connect error: Connection refused (os error 111)",
            "Connection refused (os error 111)",
        ]);
        let chain = error_chain(&e);
        assert_eq!(
            chain,
            "cannot reach the coordinator at http://x: error sending request: client error (Connect): tcp connect \
             error: Connection refused (os error 111)"
        );
        assert_eq!(chain.matches("Connection refused").count(), 1, "{chain}");
    }

    #[test]
    fn path_segments_are_escaped() {
        // Names are validated by the coordinator; the route functions percent-encode what a path cannot carry.
        assert_eq!(routes::stream("orders"), "/v1/streams/orders");
        assert_eq!(routes::stream("a b/c"), "/v1/streams/a%20b%2Fc");
    }

    #[test]
    fn exit_codes_distinguish_refusals_from_outages() {
        let api = CliError::Api {
            http: 412,
            body: ErrorResponse {
                status: protocol::Status::RevisionConflict,
                message: "stale".into(),
                member_epoch: None,
                retry_after_ms: None,
            },
        };
        assert_eq!(api.exit_code(), 1);
        assert_eq!(CliError::Refused("no".into()).exit_code(), 4);
    }
}
