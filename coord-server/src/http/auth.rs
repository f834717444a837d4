//! Bearer-token extractors: one per role, each checking the token before anything else of the request is read,
//! and the `{stream}` of the path against the token's prefixes (see [`crate::auth`]).
//!
//! Refusals are typed `UNAUTHORIZED` bodies: HTTP 401 with `WWW-Authenticate: Bearer` when the caller is unknown,
//! 403 when the token is valid but lacks the role or the stream.
//!
//! A known token then takes one request from its bucket (see [`crate::quota`]): a token over its rate gets
//! `429 RATE_LIMITED` with `Retry-After` before the body is read or anything else is done. Extractors run before
//! the body extractor, which is always a handler's last argument.

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

/// Takes one request of the token `who` from its bucket.
fn admit(state: &AppState, who: Option<usize>) -> Result<(), AuthRejection> {
    let Some(principal) = state.principal(who) else {
        return Ok(());
    };
    principal.admit().map_err(|wait| {
        state.coordinator.stats().metrics().quota_refused("rate");
        AuthRejection::Api(ApiError::rate_limited(
            &principal.name,
            principal.quota.requests_per_second,
            wait,
        ))
    })
}

/// Authorises `role` for the request, and its `{stream}` path segment when the route has one; then the rate.
/// Returns what the token reaches and which credential it is.
async fn check(parts: &mut Parts, state: &AppState, role: Role) -> Result<(Access, Option<usize>), AuthRejection> {
    let config = state.coordinator.config();
    let header = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let (access, who) = auth::authorize_as(config.credentials(), header, role).map_err(AuthRejection::Denied)?;
    // Before the stream check: a token spraying requests at streams it does not reach is limited too.
    admit(state, who)?;
    if access.covers_all() {
        return Ok((access, who));
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
    Ok((access, who))
}

/// Admin endpoints. Holds what the token reaches, for routes that span streams (`GET /v1/groups`) and for the
/// group quota, and which credential it is (its quotas).
pub(super) struct AdminAuth {
    pub access: Access,
    pub who: Option<usize>,
}

/// Consumer heartbeats. Holds the member quota of the token (`None` on an open route).
pub(super) struct ConsumerAuth(pub Option<u32>);

/// The producers' routing fetch.
pub(super) struct ProducerAuth;

/// Any valid token, whatever its role (`GET /v1/quota`): what its roles reach together, and which credential it
/// is. `None` on a coordinator without tokens.
pub(super) struct AnyAuth(pub Option<(Access, usize)>);

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AuthRejection> {
        check(parts, state, Role::Admin)
            .await
            .map(|(access, who)| AdminAuth { access, who })
    }
}

impl FromRequestParts<AppState> for ConsumerAuth {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AuthRejection> {
        let (_, who) = check(parts, state, Role::Consumer).await?;
        Ok(ConsumerAuth(state.principal(who).map(|p| p.quota.members_per_group)))
    }
}

impl FromRequestParts<AppState> for ProducerAuth {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AuthRejection> {
        check(parts, state, Role::Producer).await.map(|_| ProducerAuth)
    }
}

impl FromRequestParts<AppState> for AnyAuth {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AuthRejection> {
        let config = state.coordinator.config();
        if config.tokens.is_empty() && config.admin_token.is_none() && config.client_token.is_none() {
            return Ok(AnyAuth(None));
        }
        let header = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let mut scopes = Vec::new();
        let mut found = None;
        let mut refusal = None;
        for role in [Role::Admin, Role::Consumer, Role::Producer] {
            match auth::authorize_as(config.credentials(), header, role) {
                Ok((Access::Scoped(s), Some(who))) => {
                    scopes.extend(s);
                    found = Some(who);
                }
                // A single token of one kind leaves the other kind's routes open: not a token of this caller.
                Ok(_) | Err(Denied::WrongRole { .. }) => {}
                Err(denied) => refusal = refusal.or(Some(denied)),
            }
        }
        let Some(who) = found else {
            return Err(AuthRejection::Denied(refusal.unwrap_or(Denied::Invalid)));
        };
        admit(state, Some(who))?;
        Ok(AnyAuth(Some((Access::Scoped(scopes), who))))
    }
}
