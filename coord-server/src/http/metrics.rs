//! `GET /metrics`: the coordinator's Prometheus metrics (see [`crate::metrics`]).
//!
//! Not behind the admin token, like the probes: scrapers seldom carry one, and the page holds counts and the
//! names of streams and groups, nothing that changes state. Keep the port off the public network (the Kubernetes
//! manifests expose it only inside the cluster).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::state::AppState;

/// The Prometheus text exposition format, version 0.0.4.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders this coordinator's metrics. Reads the per-shard lag from Redis first, at most once per
/// [`LAG_MIN_REFRESH`](crate::metrics::LAG_MIN_REFRESH).
pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let body = state.coordinator.render_metrics().await;
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body)
}
