//! `POST /v1/streams/{stream}/groups/{group}/heartbeat`: join, heartbeat and leave of consumers.

use axum::extract::State;
use axum::Json;
use protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use super::auth::ConsumerAuth;
use super::error::ApiError;
use super::extract::{GroupPath, JsonBody};
use super::state::AppState;

/// Answers from what the critical section wrote to Redis, so a lost answer is repaired by the next heartbeat.
pub(super) async fn heartbeat(
    ConsumerAuth(max_members): ConsumerAuth,
    State(state): State<AppState>,
    GroupPath { stream, group }: GroupPath,
    JsonBody(req): JsonBody<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let started = std::time::Instant::now();
    let result = state
        .mutate(move |c| async move { c.heartbeat_within(&stream, &group, &req, max_members).await })
        .await;
    // Counted here, where every answer passes (the terminating fast path and store errors included).
    let status = match &result {
        Ok(response) => response.status,
        Err(e) => e.body().status,
    };
    let metrics = state.coordinator.stats().metrics();
    metrics.heartbeat_answered(status, started.elapsed());
    if status == protocol::Status::QuotaExceeded {
        metrics.quota_refused("members");
    }
    Ok(Json(result?))
}
