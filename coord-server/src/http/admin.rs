//! Admin endpoints: streams, groups, members. Reads carry the store revision as `ETag`; mutations take it back
//! as `If-Match` so an operator never overwrites a change they did not see.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use protocol::messages::{
    AddShardsRequest, CreateGroupRequest, GroupDescription, GroupList, RecreateGroupRequest, RoutingDescription,
};
use serde::Deserialize;

use super::auth::{AdminAuth, AuthRejection};
use super::error::ApiError;
use super::extract::{etag, GroupPath, IfMatch, JsonBody, MemberPath, QueryParams, StreamPath};
use super::state::AppState;
use crate::auth::{Denied, Role};
use crate::quota::TokenQuota;

fn group_answer(status: StatusCode, group: GroupDescription) -> Response {
    (status, [(header::ETAG, etag(group.revision))], Json(group)).into_response()
}

fn routing_answer(routing: RoutingDescription) -> Response {
    (StatusCode::OK, [(header::ETAG, etag(routing.revision))], Json(routing)).into_response()
}

/// The quota of the caller's token, owned for the mutation's task (`None`: an open caller, no quota).
fn token_quota(state: &AppState, auth: &AdminAuth) -> Option<TokenQuota> {
    state.principal(auth.who).map(|who| TokenQuota {
        name: who.name.clone(),
        quota: who.quota,
    })
}

/// `GET /v1/streams/{stream}`.
pub(super) async fn describe_stream(
    _auth: AdminAuth,
    State(state): State<AppState>,
    StreamPath(stream): StreamPath,
) -> Result<Response, ApiError> {
    Ok(routing_answer(state.coordinator.describe_routing(&stream).await?))
}

/// `POST /v1/streams/{stream}/shards`.
pub(super) async fn add_shards(
    auth: AdminAuth,
    State(state): State<AppState>,
    StreamPath(stream): StreamPath,
    IfMatch(if_match): IfMatch,
    JsonBody(req): JsonBody<AddShardsRequest>,
) -> Result<Response, ApiError> {
    let quota = token_quota(&state, &auth);
    let routing = state
        .mutate(move |c| async move { c.add_shards_within(&stream, req.count, if_match, quota.as_ref()).await })
        .await?;
    Ok(routing_answer(routing))
}

/// `POST /v1/streams/{stream}/groups/{group}`.
pub(super) async fn create_group(
    auth: AdminAuth,
    State(state): State<AppState>,
    GroupPath { stream, group }: GroupPath,
    JsonBody(req): JsonBody<CreateGroupRequest>,
) -> Result<Response, ApiError> {
    let quota = token_quota(&state, &auth);
    let created = state
        .mutate(move |c| async move {
            c.create_group_within(quota.as_ref(), &auth.access, &stream, &group, &req)
                .await
        })
        .await?;
    Ok(group_answer(StatusCode::CREATED, created))
}

/// `GET /v1/streams/{stream}/groups/{group}`.
pub(super) async fn describe_group(
    _auth: AdminAuth,
    State(state): State<AppState>,
    GroupPath { stream, group }: GroupPath,
) -> Result<Response, ApiError> {
    let described = state.coordinator.describe_group(&stream, &group).await?;
    Ok(group_answer(StatusCode::OK, described))
}

/// `POST /v1/streams/{stream}/groups/{group}/recreate`.
pub(super) async fn recreate_group(
    auth: AdminAuth,
    State(state): State<AppState>,
    GroupPath { stream, group }: GroupPath,
    JsonBody(req): JsonBody<RecreateGroupRequest>,
) -> Result<Response, ApiError> {
    // A lost group the index still lists is not a new group; its stream's shards are checked all the same.
    let quota = token_quota(&state, &auth);
    let created = state
        .mutate(move |c| async move {
            c.recreate_group_within(quota.as_ref(), &auth.access, &stream, &group, &req)
                .await
        })
        .await?;
    Ok(group_answer(StatusCode::CREATED, created))
}

/// `POST /v1/streams/{stream}/groups/{group}/members/{member}/fence`, and the same as
/// `DELETE /v1/streams/{stream}/groups/{group}/members/{member}`.
pub(super) async fn fence_member(
    _auth: AdminAuth,
    State(state): State<AppState>,
    MemberPath { stream, group, member }: MemberPath,
    IfMatch(if_match): IfMatch,
) -> Result<Response, ApiError> {
    let described = state
        .mutate(move |c| async move { c.fence_member(&stream, &group, &member, if_match).await })
        .await?;
    Ok(group_answer(StatusCode::OK, described))
}

/// Query of `GET /v1/groups`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ListGroupsQuery {
    /// Rebuild the index by scanning metadata keys first.
    #[serde(default)]
    rebuild: bool,
}

/// `GET /v1/groups?rebuild=true|false`: the groups of the streams the token reaches.
pub(super) async fn list_groups(
    AdminAuth { access, .. }: AdminAuth,
    State(state): State<AppState>,
    QueryParams(query): QueryParams<ListGroupsQuery>,
) -> Result<Json<GroupList>, AuthRejection> {
    // A rebuild scans every tenant's keys: only a token that reaches every stream may ask for that work.
    if query.rebuild && !access.covers_all() {
        return Err(AuthRejection::Denied(Denied::NeedsAllStreams { role: Role::Admin }));
    }
    // A rebuild writes the index, but the index holds nothing that cannot be rebuilt again: no gate needed.
    let mut list = state
        .coordinator
        .list_groups(query.rebuild)
        .await
        .map_err(|e| AuthRejection::Api(e.into()))?;
    list.groups.retain(|g| access.covers(g.stream.as_str()));
    Ok(Json(list))
}
