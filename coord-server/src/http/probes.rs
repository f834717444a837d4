//! The probe listener's router: `/healthz`, `/readyz` and `/metrics` only (see [`crate::server::connections`]).
//!
//! It is the API router behind a filter, so the three routes answer exactly as they do on the main port (same
//! handlers, timeout and logging); any other path is `404 INVALID_REQUEST`, so the probe port exposes no API.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use super::{router, ApiError, HEALTHZ, METRICS, READYZ};
use crate::coordinator::Coordinator;

/// The paths the probe listener serves.
pub const PROBE_PATHS: [&str; 3] = [HEALTHZ, READYZ, METRICS];

/// The router of the probe listener: [`PROBE_PATHS`] and nothing else.
pub fn probe_router(coordinator: Coordinator) -> Router {
    router(coordinator).layer(axum::middleware::from_fn(only_probe_paths))
}

async fn only_probe_paths(req: Request, next: Next) -> Response {
    if PROBE_PATHS.contains(&req.uri().path()) {
        next.run(req).await
    } else {
        ApiError::not_found(req.uri().path()).into_response()
    }
}
