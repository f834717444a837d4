//! Every error answer of the HTTP API: one typed [`ErrorResponse`] body, whatever produced it.
//!
//! [`error_response`] is the one mapping from a coordinator [`Error`] to an HTTP status and a wire [`Status`].
//! The constructors below cover what never reaches the coordinator (rejected extractors, a missing token, an
//! unknown route, a request that ran out of time), so a client parses one shape for every failure and never
//! meets axum's plain-text defaults.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use protocol::messages::ErrorResponse;
use protocol::Status;
use std::sync::LazyLock;
use std::time::Duration;
use tracing::{debug, warn};

use crate::error::Error;
use crate::log_limit::LogLimiter;

/// Suggested wait after `COORDINATOR_TERMINATING`: another instance can usually answer at once.
const RETRY_TERMINATING_MS: u64 = 200;
/// Suggested wait after `STORE_UNAVAILABLE`: a busy mutex or a Redis hiccup usually clears within a second.
const RETRY_STORE_MS: u64 = 1_000;
/// Suggested wait after `METADATA_UNAVAILABLE`: only an operator fixes it, so retrying fast only adds load.
const RETRY_METADATA_MS: u64 = 5_000;
/// Suggested wait after `QUOTA_EXCEEDED`: usage drops when a member leaves or a group goes, or an operator raises
/// the quota; HTTP 429 asks for a `Retry-After`, and looking again sooner only adds load.
const RETRY_QUOTA_MS: u64 = 60_000;

/// How often a server-side refusal of one status is logged at most: the same refusal repeated by every member of
/// a lost group every heartbeat says nothing new after its first line (metrics count every one).
pub const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(10);

/// Limits the `request failed` lines, one window per wire status (a handful of keys).
static REFUSAL_LOGS: LazyLock<LogLimiter> = LazyLock::new(|| LogLimiter::new(REFUSAL_LOG_WINDOW, 64));

/// Whether to log a server-side failure of `key` now (`Some(suppressed since the last line)`), shared by every
/// log line the HTTP layer writes for a failed request so one refusal never costs more than one line per window.
pub(crate) fn admit_failure_log(key: &str) -> Option<u64> {
    REFUSAL_LOGS.admit(key)
}

/// An error answer: the HTTP status plus the typed body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    http: StatusCode,
    body: ErrorResponse,
}

/// Maps a coordinator error to its HTTP answer: the HTTP status is [`Status::http_status`] of
/// [`Error::status`], and retryable statuses carry a `retryAfterMs` (also sent as a `Retry-After` header).
pub fn error_response(err: &Error) -> ApiError {
    let status = err.status();
    let member_epoch = match err {
        Error::Rejected { member_epoch, .. } => *member_epoch,
        _ => None,
    };
    let message = match err {
        // The status is already in the body; repeating it in the message only adds noise.
        Error::Rejected { message, .. } => message.clone(),
        other => other.to_string(),
    };
    let mut api = ApiError::new(status, message);
    api.body.member_epoch = member_epoch;
    api
}

impl ApiError {
    /// An error with the HTTP status of `status` and the default retry hint for it.
    fn new(status: Status, message: impl Into<String>) -> Self {
        let http = StatusCode::from_u16(status.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after_ms = match status {
            Status::CoordinatorTerminating => Some(RETRY_TERMINATING_MS),
            Status::StoreUnavailable => Some(RETRY_STORE_MS),
            Status::MetadataUnavailable => Some(RETRY_METADATA_MS),
            Status::QuotaExceeded => Some(RETRY_QUOTA_MS),
            _ => None,
        };
        ApiError {
            http,
            body: ErrorResponse {
                status,
                message: message.into(),
                member_epoch: None,
                retry_after_ms,
            },
        }
    }

    pub(super) fn with_http(mut self, http: StatusCode) -> Self {
        self.http = http;
        self
    }

    /// `400 INVALID_REQUEST`.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(Status::InvalidRequest, message)
    }

    /// `401 UNAUTHORIZED`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError::new(Status::Unauthorized, message)
    }

    /// `404 INVALID_REQUEST`: no route has this path.
    pub fn not_found(path: &str) -> Self {
        ApiError::invalid(format!("no route for {path}")).with_http(StatusCode::NOT_FOUND)
    }

    /// `405 INVALID_REQUEST`: the path exists, but not with this method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError::invalid(format!("{method} is not allowed on {path}")).with_http(StatusCode::METHOD_NOT_ALLOWED)
    }

    /// `413 INVALID_REQUEST`: the body is larger than the configured limit.
    pub fn too_large(detail: impl std::fmt::Display) -> Self {
        ApiError::invalid(format!("request body too large: {detail}")).with_http(StatusCode::PAYLOAD_TOO_LARGE)
    }

    /// `503 STORE_UNAVAILABLE`: the request did not finish within the request timeout. A mutation may still
    /// complete after this answer; the client's retry gets the recorded result.
    pub fn timed_out(timeout: std::time::Duration) -> Self {
        ApiError::new(
            Status::StoreUnavailable,
            format!("request did not complete within {} ms", timeout.as_millis()),
        )
    }

    /// `429 RATE_LIMITED`: the token `name` spent its request bucket on this replica; the next request is
    /// admitted after `wait` (sent as `retryAfterMs`, and rounded up to whole seconds in `Retry-After`).
    pub fn rate_limited(name: &str, rate: u32, wait: std::time::Duration) -> Self {
        let mut api = ApiError::new(
            Status::RateLimited,
            format!("token {name} sent more than its {rate} requests per second to this coordinator"),
        );
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        api.body.retry_after_ms = Some(ms);
        api
    }

    /// `503 STORE_UNAVAILABLE`: the request came in on a connection of the probe reserve (every regular slot is
    /// taken), which serves only `/healthz` and `/readyz`.
    pub fn at_connection_limit(limit: usize) -> Self {
        ApiError::new(
            Status::StoreUnavailable,
            format!("this instance serves its connection limit ({limit}); retry later or use another instance"),
        )
    }

    /// `500 STORE_UNAVAILABLE`: the task running the operation failed (a bug). Retryable: whatever it wrote
    /// is recorded, and the retry answers from Redis.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(Status::StoreUnavailable, message).with_http(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The HTTP status.
    pub fn http_status(&self) -> StatusCode {
        self.http
    }

    /// The typed body.
    pub fn body(&self) -> &ErrorResponse {
        &self.body
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        error_response(&err)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        // The body limit surfaces here (axum's limit is enforced while the extractor buffers the body).
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::too_large(rejection.body_text());
        }
        ApiError::invalid(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::invalid(rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::invalid(rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.http.is_server_error() {
            if let Some(suppressed) = admit_failure_log(self.body.status.as_str()) {
                warn!(status = %self.body.status, message = %self.body.message, suppressed,
                    "request failed (repeats of this status are logged once per {} s)", REFUSAL_LOG_WINDOW.as_secs());
            }
        } else {
            debug!(status = %self.body.status, message = %self.body.message, "request refused");
        }
        let retry_after = self.body.retry_after_ms.map(|ms| {
            // Retry-After counts whole seconds; round up so a client never retries earlier than suggested.
            HeaderValue::from(ms.div_ceil(1000))
        });
        // A terminating instance closes the connection: a client's pool would otherwise keep reusing a kept-alive
        // connection to it (a busy client never lets it go idle) and never reach the instance that replaced it.
        let terminating = self.body.status == Status::CoordinatorTerminating;
        let mut response = (self.http, Json(self.body)).into_response();
        if let Some(value) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        if terminating {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;

    #[test]
    fn every_error_keeps_its_wire_status_and_http_code() {
        let cases = [
            (Error::Terminating, 503),
            (Error::MetadataUnavailable("gone".into()), 503),
            (Error::NotFound("typo".into()), 404),
            (Error::InvalidRequest("bad".into()), 400),
            (Error::AlreadyExists("g".into()), 409),
            (
                Error::RevisionConflict {
                    expected: protocol::StoreRevision(1),
                    found: protocol::StoreRevision(2),
                },
                412,
            ),
            (
                Error::Store(StoreError::MutexBusy {
                    key: "k".into(),
                    waited_ms: 1,
                }),
                503,
            ),
        ];
        for (err, code) in cases {
            let api = error_response(&err);
            assert_eq!(api.http_status().as_u16(), code, "{err}");
            assert_eq!(api.body().status, err.status());
            assert_eq!(
                api.body().retry_after_ms.is_some(),
                err.status().is_retryable(),
                "{err}"
            );
        }
    }

    #[test]
    fn fenced_rejection_carries_the_recorded_epoch() {
        let err = Error::Rejected {
            status: Status::FencedMemberEpoch,
            message: "stale".into(),
            member_epoch: Some(protocol::MemberEpoch(7)),
        };
        let api = error_response(&err);
        assert_eq!(api.http_status(), StatusCode::CONFLICT);
        assert_eq!(api.body().member_epoch, Some(protocol::MemberEpoch(7)));
        assert_eq!(api.body().message, "stale");
    }

    #[test]
    fn quota_and_rate_refusals_are_429_with_a_retry_after() {
        let quota = error_response(&Error::Rejected {
            status: Status::QuotaExceeded,
            message: "full".into(),
            member_epoch: None,
        })
        .into_response();
        assert_eq!(quota.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(quota.headers()[header::RETRY_AFTER], "60");
        let rate = ApiError::rate_limited("t", 10, Duration::from_millis(1_200));
        assert_eq!(rate.body().retry_after_ms, Some(1_200));
        let response = rate.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2", "rounded up");
    }

    #[test]
    fn retry_after_header_rounds_up_to_seconds() {
        let response = ApiError::new(Status::CoordinatorTerminating, "bye").into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            response.headers()[header::CONNECTION],
            "close",
            "clients must not reuse the connection"
        );
    }
}
