//! `POST /v1/streams/{stream}/groups/{group}/heartbeat`: join, heartbeat and leave of consumers.

use axum::extract::State;
use axum::Json;
use protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use super::error::ApiError;
use super::extract::{ClientAuth, GroupPath, JsonBody};
use super::AppState;

/// Answers from what the critical section wrote to Redis, so a lost answer is repaired by the next heartbeat.
pub(super) async fn heartbeat(
    _auth: ClientAuth,
    State(state): State<AppState>,
    GroupPath { stream, group }: GroupPath,
    JsonBody(req): JsonBody<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let response = state
        .mutate(move |c| async move { c.heartbeat(&stream, &group, &req).await })
        .await?;
    Ok(Json(response))
}
