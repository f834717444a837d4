//! The coordinator HTTP client shared by both SDKs.
//!
//! It holds several coordinator URLs (for rolling updates: `1 -> 2 -> 1` coordinators). A call goes to the URL
//! that worked last; a connection error, a timeout, or `503 COORDINATOR_TERMINATING` moves on to the next URL at
//! once, within the same call, so a terminating instance costs one extra request, not one heartbeat interval.
//! Every call is idempotent on the coordinator side, so retrying it elsewhere is safe.

use protocol::messages::{ErrorResponse, HeartbeatRequest, HeartbeatResponse, RoutingQuery, RoutingResponse};
use protocol::names::{GroupName, StreamName};
use protocol::redact::redact_url;
use protocol::{MemberEpoch, Status};
use redis_link::TlsOptions;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use thiserror::Error;

use crate::coord_tls::{http_client, tls_failure, HttpClientError};

/// A coordinator call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CoordError {
    /// The coordinator answered with an error status.
    #[error("coordinator answered {status}: {message}")]
    Status {
        /// The wire status.
        status: Status,
        /// The coordinator's explanation.
        message: String,
        /// For `FENCED_MEMBER_EPOCH`: the epoch the coordinator records.
        member_epoch: Option<MemberEpoch>,
        /// How long the coordinator asks the client to wait before it tries again (`retryAfterMs`): for
        /// `RATE_LIMITED` the time until its token's bucket admits a request.
        retry_after: Option<Duration>,
    },
    /// No coordinator URL could be reached (connection refused, reset, timeout).
    #[error("no coordinator reachable (last tried {url}): {source}")]
    Unreachable {
        /// The last URL tried.
        url: String,
        /// The last transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The TLS handshake with the coordinator failed (its certificate is not trusted or not for this name, or it
    /// refused this client's certificate): every retry fails the same way until the certificates change.
    #[error("TLS to the coordinator at {url} failed: {reason}")]
    Tls {
        /// The URL.
        url: String,
        /// rustls's reason (for example `invalid peer certificate: UnknownIssuer`).
        reason: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The answer could not be understood (not our JSON): a proxy or a version mismatch.
    #[error("unexpected answer from {url}: {detail}")]
    Decode {
        /// The URL.
        url: String,
        /// What was wrong.
        detail: String,
    },
    /// The coordinator refused a field this SDK sends: it is older than the SDK (for example, one from before
    /// member incarnations). Upgrade the coordinators before the SDKs; retrying does not help.
    #[error("the coordinator at {url} does not speak this SDK's protocol (upgrade the coordinators first): {message}")]
    Incompatible {
        /// The URL.
        url: String,
        /// The coordinator's refusal.
        message: String,
    },
    /// No coordinator URL was given.
    #[error("at least one coordinator URL is required")]
    NoUrl,
    /// A coordinator URL is not `http(s)://...`.
    #[error("coordinator URL {0:?} must start with http:// or https://")]
    InvalidUrl(String),
    /// The HTTP client could not be built (the TLS settings or the HTTP stack refused).
    #[error("cannot build the coordinator HTTP client: {0}")]
    HttpClient(#[source] HttpClientError),
}

impl CoordError {
    /// The coordinator's status, when it answered.
    pub fn status(&self) -> Option<Status> {
        match self {
            CoordError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether retrying later may succeed (outage, terminating, metadata unavailable, store unavailable).
    pub fn is_retryable(&self) -> bool {
        match self {
            CoordError::Status { status, .. } => status.is_retryable(),
            CoordError::Unreachable { .. } | CoordError::Decode { .. } => true,
            CoordError::Incompatible { .. }
            | CoordError::Tls { .. }
            | CoordError::NoUrl
            | CoordError::InvalidUrl(_)
            | CoordError::HttpClient(_) => false,
        }
    }

    /// The wait the coordinator asked for before the next try (`retryAfterMs`, the `Retry-After` header).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CoordError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the token reached a quota (`QUOTA_EXCEEDED`: groups, shards or members per group): retrying the
    /// same request does not help until an operator raises the quota or usage drops.
    pub fn is_quota_exceeded(&self) -> bool {
        self.status() == Some(Status::QuotaExceeded)
    }

    /// Whether the member must stop everything and rejoin with epoch 0.
    pub fn requires_rejoin(&self) -> bool {
        self.status().is_some_and(Status::requires_rejoin)
    }
}

/// The answer of a [`CoordTransport`] call.
pub type CoordFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, CoordError>> + Send + 'a>>;

/// The coordinator calls the SDKs' drivers make: the consumer's heartbeat loop and the producer's routing
/// refresher talk to the coordinator only through this, so their schedules (lease expiry, backoff, refresh times)
/// can be tested under paused Tokio time against an in-memory coordinator (`testing::FakeCoord`, feature
/// `test-util`) instead of HTTP. [`CoordClient`] is the HTTP implementation.
///
/// Both calls are idempotent on the coordinator side, and cancel safe: a dropped call may or may not have reached
/// the coordinator.
pub trait CoordTransport: Send + Sync + std::fmt::Debug {
    /// Sends a heartbeat (join with epoch 0, leave with epoch -1). See [`CoordClient::heartbeat`].
    fn heartbeat<'a>(
        &'a self,
        stream: &'a StreamName,
        group: &'a GroupName,
        req: &'a HeartbeatRequest,
    ) -> CoordFuture<'a, HeartbeatResponse>;

    /// Fetches a stream's routing. See [`CoordClient::routing`].
    fn routing<'a>(&'a self, stream: &'a StreamName, query: RoutingQuery) -> CoordFuture<'a, RoutingResponse>;
}

impl CoordTransport for CoordClient {
    fn heartbeat<'a>(
        &'a self,
        stream: &'a StreamName,
        group: &'a GroupName,
        req: &'a HeartbeatRequest,
    ) -> CoordFuture<'a, HeartbeatResponse> {
        Box::pin(CoordClient::heartbeat(self, stream, group, req))
    }

    fn routing<'a>(&'a self, stream: &'a StreamName, query: RoutingQuery) -> CoordFuture<'a, RoutingResponse> {
        Box::pin(CoordClient::routing(self, stream, query))
    }
}

/// The first of `urls` that is not an `http://` or `https://` base URL, if any: what [`CoordClient::new`]
/// refuses, and what both SDKs' `build()` check before it.
pub fn first_invalid_url(urls: &[String]) -> Option<&str> {
    urls.iter()
        .map(String::as_str)
        .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
}

/// HTTP client for the coordinator's `/v1` API, with failover over several URLs.
#[derive(Debug)]
pub struct CoordClient {
    http: reqwest::Client,
    urls: Vec<String>,
    current: AtomicUsize,
    token: Option<String>,
}

impl CoordClient {
    /// A client over `urls` (base URLs such as `http://127.0.0.1:7400`), each request bounded by `timeout`;
    /// `https://` URLs are verified against the system's roots.
    ///
    /// # Errors
    /// [`CoordError::NoUrl`] without URLs, [`CoordError::InvalidUrl`] with a URL that is not `http(s)://...`,
    /// [`CoordError::HttpClient`] when the HTTP client cannot be built.
    pub fn new(urls: Vec<String>, timeout: Duration, token: Option<String>) -> Result<Self, CoordError> {
        CoordClient::with_tls(urls, timeout, token, &TlsOptions::default())
    }

    /// [`CoordClient::new`] with the TLS settings of `https://` URLs (a private CA, a client certificate).
    ///
    /// # Errors
    /// As [`CoordClient::new`]; [`CoordError::HttpClient`] also when a TLS file cannot be read.
    pub fn with_tls(
        urls: Vec<String>,
        timeout: Duration,
        token: Option<String>,
        tls: &TlsOptions,
    ) -> Result<Self, CoordError> {
        if urls.is_empty() {
            return Err(CoordError::NoUrl);
        }
        let urls: Vec<String> = urls.into_iter().map(|u| u.trim_end_matches('/').to_owned()).collect();
        if let Some(bad) = first_invalid_url(&urls) {
            return Err(CoordError::InvalidUrl(bad.to_owned()));
        }
        let http =
            http_client(timeout, Some(timeout.min(Duration::from_secs(2))), tls).map_err(CoordError::HttpClient)?;
        Ok(CoordClient {
            http,
            urls,
            current: AtomicUsize::new(0),
            token,
        })
    }

    /// The configured URLs.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Sends a heartbeat (join with epoch 0, leave with epoch -1).
    ///
    /// # Errors
    /// [`CoordError`]; `Status` errors carry the coordinator's typed status.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call may or may not have reached the coordinator, which is harmless because a
    /// heartbeat is idempotent.
    pub async fn heartbeat(
        &self,
        stream: &StreamName,
        group: &GroupName,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, CoordError> {
        let path = protocol::routes::heartbeat(stream.as_str(), group.as_str());
        self.call(|http, base| http.post(format!("{base}{path}")).json(req))
            .await
    }

    /// Fetches a stream's routing, carrying the producer's current and highest observed routing versions.
    ///
    /// # Errors
    /// [`CoordError`].
    ///
    /// # Cancel safety
    /// Cancel safe: the call only reads.
    pub async fn routing(&self, stream: &StreamName, query: RoutingQuery) -> Result<RoutingResponse, CoordError> {
        let path = protocol::routes::routing_with(stream.as_str(), &query);
        self.call(|http, base| http.get(format!("{base}{path}"))).await
    }

    async fn call<T, F>(&self, build: F) -> Result<T, CoordError>
    where
        T: serde::de::DeserializeOwned,
        F: Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    {
        let start = self.current.load(Ordering::Relaxed);
        let mut last_err = None;
        for attempt in 0..self.urls.len() {
            let i = (start + attempt) % self.urls.len();
            let base = &self.urls[i];
            let mut req = build(&self.http, base);
            if let Some(token) = &self.token {
                req = req.bearer_auth(token);
            }
            match req.send().await {
                Err(e) if tls_failure(&e).is_some() => {
                    let reason = tls_failure(&e).unwrap_or_default();
                    tracing::debug!(url = %redact_url(base), error = %reason, "TLS to the coordinator failed; trying the next URL");
                    last_err = Some(CoordError::Tls {
                        url: redact_url(base),
                        reason,
                        source: e,
                    });
                }
                Err(e) => {
                    tracing::debug!(url = %redact_url(base), error = %e, "coordinator unreachable; trying the next URL");
                    last_err = Some(CoordError::Unreachable {
                        url: redact_url(base),
                        source: e,
                    });
                }
                Ok(resp) => {
                    let http_status = resp.status();
                    let body = match resp.bytes().await {
                        Ok(b) => b,
                        Err(e) => {
                            last_err = Some(CoordError::Unreachable {
                                url: redact_url(base),
                                source: e,
                            });
                            continue;
                        }
                    };
                    if http_status.is_success() {
                        self.current.store(i, Ordering::Relaxed);
                        return serde_json::from_slice(&body).map_err(|e| CoordError::Decode {
                            url: redact_url(base),
                            detail: e.to_string(),
                        });
                    }
                    let err = match serde_json::from_slice::<ErrorResponse>(&body) {
                        // What a coordinator older than this SDK answers to a field it does not know.
                        Ok(e) if e.status == Status::InvalidRequest && e.message.contains("unknown field `") => {
                            CoordError::Incompatible {
                                url: redact_url(base),
                                message: e.message,
                            }
                        }
                        Ok(e) => CoordError::Status {
                            status: e.status,
                            message: e.message,
                            member_epoch: e.member_epoch,
                            retry_after: e.retry_after_ms.map(Duration::from_millis),
                        },
                        Err(_) => CoordError::Decode {
                            url: redact_url(base),
                            detail: format!("HTTP {http_status} with a body that is not an ErrorResponse"),
                        },
                    };
                    let fail_over = matches!(err.status(), Some(Status::CoordinatorTerminating))
                        || matches!(err, CoordError::Decode { .. });
                    if !fail_over {
                        self.current.store(i, Ordering::Relaxed);
                        return Err(err);
                    }
                    tracing::debug!(url = %redact_url(base), "coordinator terminating or answering garbage; trying the next URL");
                    last_err = Some(err);
                }
            }
        }
        // Next call starts from the URL after the one that failed first.
        self.current.store((start + 1) % self.urls.len(), Ordering::Relaxed);
        Err(last_err.expect("at least one URL was tried"))
    }
}
