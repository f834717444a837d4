//! `GET /v1/streams/{stream}/routing`: the producers' routing fetch.

use axum::extract::State;
use axum::Json;
use protocol::messages::{RoutingQuery, RoutingResponse};

use super::error::ApiError;
use super::extract::{ClientAuth, QueryParams, StreamPath};
use super::AppState;

/// A read: it takes no mutex, so it is neither gated by shutdown nor run detached.
pub(super) async fn fetch_routing(
    _auth: ClientAuth,
    State(state): State<AppState>,
    StreamPath(stream): StreamPath,
    QueryParams(query): QueryParams<RoutingQuery>,
) -> Result<Json<RoutingResponse>, ApiError> {
    Ok(Json(state.coordinator.routing(&stream, query).await?))
}
