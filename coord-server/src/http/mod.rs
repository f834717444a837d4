//! The coordinator's HTTP/JSON API: versioned under `/v1`, camelCase JSON bodies from [`protocol::messages`],
//! typed [`ErrorResponse`](protocol::messages::ErrorResponse) bodies for every failure.
//!
//! # Layout
//! * `heartbeat`: consumer join, heartbeat and leave.
//! * `routing`: the producers' routing fetch.
//! * `admin`: streams, groups and members (ETag / If-Match on the store revision).
//! * `health`: `/healthz` and `/readyz`.
//! * `metrics`: `/metrics`, the Prometheus text format (see [`crate::metrics`]).
//! * `probes`: the probe listener's router, those three routes only.
//! * `status`: `/status`, the operators' HTML page.
//! * `security_headers`: `nosniff` on every answer; the status page's CSP and caching rules.
//! * `quota`: `/v1/quota`, the caller's quotas and usage, and the quota section of `/status`.
//! * `extract`: validated path names, strict JSON, `If-Match`.
//! * `request_span`: the span of each request, without the query's secrets.
//! * `auth`: bearer tokens, one extractor per role, checked against the `{stream}` of the path.
//! * [`error`]: the one mapping from [`crate::Error`] to an HTTP answer.
//!
//! # Ordering contract
//! Mutations run in a task of their own: a client that disconnects, or a request that hits the request timeout,
//! stops waiting for the answer but never cuts a critical section in half (which would leave the group's Redis
//! mutex held until its TTL). The answer is sent only after the section wrote to Redis.
//!
//! [`ROUTES`] lists every route; [`router`] is built from that list and nothing else, and a test checks the list
//! against `openapi.json`.

mod admin;
mod auth;
pub mod error;
mod extract;
mod health;
mod heartbeat;
mod metrics;
mod probes;
mod quota;
mod request_span;
mod routing;
mod security_headers;
mod state;
mod status;
mod status_usage;

use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;
use std::time::Duration;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::trace::TraceLayer;

use crate::coordinator::Coordinator;
pub use error::{error_response, ApiError};
pub use probes::{probe_router, PROBE_PATHS};
use protocol::messages::MAX_HEARTBEAT_REQUEST_BYTES;
use state::AppState;

// The route templates live in `protocol` (clients build their paths from the same list).
pub use protocol::routes::{
    FENCE, GROUP, GROUPS, HEALTHZ, HEARTBEAT, MEMBER, METRICS, QUOTA, READYZ, RECREATE, ROUTES, ROUTING, SHARDS,
    STATUS, STREAM,
};

/// Every route as (method, path template); the router serves exactly these.
pub fn routes() -> &'static [(&'static str, &'static str)] {
    ROUTES
}

/// The handler of one listed route. `None` only for a pair missing here, which the router refuses to start with.
fn endpoint(method: &str, path: &str) -> Option<MethodRouter<AppState>> {
    Some(match (method, path) {
        ("POST", HEARTBEAT) => post(heartbeat::heartbeat),
        ("GET", ROUTING) => get(routing::fetch_routing),
        ("GET", STREAM) => get(admin::describe_stream),
        ("POST", SHARDS) => post(admin::add_shards),
        ("POST", GROUP) => post(admin::create_group),
        ("GET", GROUP) => get(admin::describe_group),
        ("POST", RECREATE) => post(admin::recreate_group),
        ("POST", FENCE) => post(admin::fence_member),
        ("DELETE", MEMBER) => delete(admin::fence_member),
        ("GET", GROUPS) => get(admin::list_groups),
        ("GET", QUOTA) => get(quota::describe),
        ("GET", HEALTHZ) => get(health::healthz),
        ("GET", READYZ) => get(health::readyz),
        ("GET", METRICS) => get(metrics::metrics),
        ("GET", STATUS) => get(status::status),
        _ => return None,
    })
}

/// The router of the whole API, with the body limit and request timeout of the coordinator's configuration. The
/// heartbeat route takes bodies up to the larger of that limit and [`MAX_HEARTBEAT_REQUEST_BYTES`].
///
/// # Panics
/// If a pair of [`ROUTES`] has no handler: a programming error caught by every test that builds a router.
pub fn router(coordinator: Coordinator) -> Router {
    let config = coordinator.config();
    let timeout = config.request_timeout;
    let body_limit = config.body_limit_bytes;
    let app = ROUTES.iter().fold(Router::new(), |app, &(method, path)| {
        let mut handler = endpoint(method, path).unwrap_or_else(|| panic!("no handler for {method} {path}"));
        if path == HEARTBEAT {
            // A member of the largest group lists every shard it holds: more than the general limit allows.
            handler = handler.layer(DefaultBodyLimit::max(body_limit.max(MAX_HEARTBEAT_REQUEST_BYTES)));
        }
        app.route(path, handler)
    });
    app.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // axum enforces this while an extractor buffers the body, so an oversized body is refused by
        // `JsonBody` as a typed 413 instead of a plain-text one.
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn(move |req: Request, next: Next| {
            request_deadline(req, next, timeout)
        }))
        .layer(axum::middleware::map_response(security_headers::nosniff))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span::request_span)
                .on_failure(log_failure),
        )
        .with_state(AppState::new(coordinator))
}

/// tower-http's default writes an ERROR line for every 5xx: a second line for each refusal [`ApiError`] already
/// logged. Repeats go through the same limiter, so a refused request costs at most one line per window.
fn log_failure(class: ServerErrorsFailureClass, latency: Duration, _span: &tracing::Span) {
    if let Some(suppressed) = error::admit_failure_log(&format!("http {class}")) {
        tracing::error!(classification = %class, latency = ?latency, suppressed, "response failed");
    }
}

/// The request timeout, forgiving one expiry that a stop of this process caused (SIGSTOP, a paused VM): a request
/// that arrived just before the stop is served when the process runs again, instead of failing with a timeout
/// that says nothing about Redis or the work ([`crate::deadline`]).
async fn request_deadline(req: Request, next: Next, timeout: Duration) -> Response {
    match crate::deadline::within(timeout, next.run(req)).await {
        Ok(response) => response,
        Err(crate::deadline::Elapsed) => ApiError::timed_out(timeout).into_response(),
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::method_not_allowed(req.method().as_str(), req.uri().path())
}
