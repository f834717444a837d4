//! `GET /v1/streams/{stream}/routing`: the producers' routing fetch.

use axum::extract::State;
use axum::Json;
use protocol::messages::{RoutingQuery, RoutingResponse};

use crate::Error;

use super::auth::ProducerAuth;
use super::error::ApiError;
use super::extract::{QueryParams, StreamPath};
use super::state::AppState;

/// A read: it takes no mutex and is not run detached. A terminating instance still refuses it (with
/// `Connection: close`), so producers move to another instance with the consumers instead of holding on to one
/// that is going away.
pub(super) async fn fetch_routing(
    _auth: ProducerAuth,
    State(state): State<AppState>,
    StreamPath(stream): StreamPath,
    QueryParams(query): QueryParams<RoutingQuery>,
) -> Result<Json<RoutingResponse>, ApiError> {
    query.validate().map_err(ApiError::invalid)?;
    if state.coordinator.gate().is_terminating() {
        return Err(Error::Terminating.into());
    }
    Ok(Json(state.coordinator.routing(&stream, query).await?))
}
