//! Bearer-token extractors: one per role, each checking the token before anything else of the request is read,
//! and the `{stream}` of the path against the token's prefixes (see [`crate::auth`]).
//!
//! Refusals are typed `UNAUTHORIZED` bodies: HTTP 401 with `WWW-Authenticate: Bearer` when the caller is unknown,
//! 403 when the token is valid but lacks the role or the stream.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;
use crate::auth::{self, Access, Denied, Role};

/// A refused request.
#[derive(Debug)]
pub(super) enum AuthRejection {
    /// The token is missing, wrong, or does not reach the stream.
    Denied(Denied),
    /// Any other refusal (a path that cannot be read, a failure of the operation itself).
    Api(ApiError),
}

impl IntoResponse for AuthRejection {
    fn into_response(self) -> Response {
        let denied = match self {
            AuthRejection::Api(e) => return e.into_response(),
            AuthRejection::Denied(denied) => denied,
        };
        let mut response = ApiError::unauthorized(denied.to_string()).into_response();
        if denied.is_unauthenticated() {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        } else {
            *response.status_mut() = StatusCode::FORBIDDEN;
        }
        response
    }
}

/// Authorises `role` for the request, and its `{stream}` path segment when the route has one.
async fn check(parts: &mut Parts, state: &AppState, role: Role) -> Result<Access, AuthRejection> {
    let config = state.coordinator.config();
    let header = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let access = auth::authorize(config.credentials(), header, role).map_err(AuthRejection::Denied)?;
    if access.covers_all() {
        return Ok(access);
    }
    let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
        .await
        .map_err(|e| AuthRejection::Api(e.into()))?;
    if let Some((_, stream)) = params.iter().find(|(k, _)| k == "stream") {
        // The raw segment: a name the path extractor will refuse is refused after this, never let through.
        if !access.covers(stream) {
            return Err(AuthRejection::Denied(Denied::OutOfScope {
                role,
                stream: stream.clone(),
            }));
        }
    }
    Ok(access)
}

/// Admin endpoints. Holds what the token reaches, for routes that span streams (`GET /v1/groups`).
pub(super) struct AdminAuth(pub Access);

/// Consumer heartbeats.
pub(super) struct ConsumerAuth;

/// The producers' routing fetch.
pub(super) struct ProducerAuth;

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AuthRejection> {
        check(parts, state, Role::Admin).await.map(AdminAuth)
    }
}

impl FromRequestParts<AppState> for ConsumerAuth {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AuthRejection> {
        check(parts, state, Role::Consumer).await.map(|_| ConsumerAuth)
    }
}

impl FromRequestParts<AppState> for ProducerAuth {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AuthRejection> {
        check(parts, state, Role::Producer).await.map(|_| ProducerAuth)
    }
}
