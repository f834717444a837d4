//! `GET /v1/quota`: the quotas of the caller's token and its usage; and the quota section of `/status`.

use axum::extract::State;
use axum::Json;
use protocol::messages::QuotaDescription;
use std::fmt::Write as _;

use super::auth::{AnyAuth, AuthRejection};
use super::error::ApiError;
use super::state::AppState;
use super::status::escape;
use crate::auth::Access;
use crate::coordinator::Usage;
use crate::quota::principals::Principal;
use crate::quota::Quota;

/// `GET /v1/quota`, with a token of any role.
pub(super) async fn describe(
    AnyAuth(caller): AnyAuth,
    State(state): State<AppState>,
) -> Result<Json<QuotaDescription>, AuthRejection> {
    let coordinator = &state.coordinator;
    let usage = |quota, access| async move {
        let usage = coordinator.quota_usage(quota, &access).await;
        usage.map_err(|e| AuthRejection::Api(e.into()))
    };
    let Some((access, who)) = caller else {
        // No tokens: nothing to tell callers apart by, so no limit (the maximum of every field).
        let u = usage(UNLIMITED, Access::Open).await?;
        return Ok(Json(description(OPEN_NAME, &u, UNLIMITED, u32::MAX)));
    };
    let principal = state
        .principal(Some(who))
        .ok_or_else(|| AuthRejection::Api(ApiError::internal("the token has no principal")))?;
    let u = usage(principal.quota, access).await?;
    Ok(Json(description(
        &principal.name,
        &u,
        principal.quota,
        principal.available(),
    )))
}

/// The name `GET /v1/quota` gives the caller of a coordinator without tokens.
pub const OPEN_NAME: &str = "open";

/// The limits of a coordinator without tokens: none.
const UNLIMITED: Quota = Quota {
    groups: u32::MAX,
    shards_per_group: u32::MAX,
    members_per_group: u32::MAX,
    requests_per_second: u32::MAX,
    request_burst: u32::MAX,
};

fn description(name: &str, u: &Usage, quota: Quota, available: u32) -> QuotaDescription {
    QuotaDescription {
        token: name.to_owned(),
        groups: u.groups,
        shards_per_group: u.shards_per_group,
        members_per_group: u.members_per_group,
        requests_per_second: quota.requests_per_second,
        request_burst: quota.request_burst,
        requests_available: available,
    }
}

/// The quota section of `/status`: the caller's token with its usage; for a token that reaches every stream, also
/// every other token's limits and its bucket on this replica.
pub(super) async fn render(body: &mut String, state: &AppState, who: Option<usize>, access: &Access) {
    body.push_str("<section><h2>Quotas</h2>");
    let Some(caller) = state.principal(who) else {
        body.push_str("<p>No tokens are configured: no quotas are enforced.</p></section>");
        return;
    };
    match state.coordinator.quota_usage(caller.quota, access).await {
        Ok(u) => {
            let _ = write!(
                body,
                "<table><tr><th>token</th><th>quota</th><th>used</th><th>limit</th></tr>\
                 <tr><td rowspan=\"3\">{name}</td><td>groups</td><td>{}</td><td>{}</td></tr>\
                 <tr><td>shards per group (largest)</td><td>{}</td><td>{}</td></tr>\
                 <tr><td>members per group (largest)</td><td>{}</td><td>{}</td></tr></table>",
                u.groups.used,
                u.groups.limit,
                u.shards_per_group.used,
                u.shards_per_group.limit,
                u.members_per_group.used,
                u.members_per_group.limit,
                name = escape(&caller.name),
            );
        }
        Err(e) => {
            let _ = write!(
                body,
                "<p class=\"err\">usage unreadable: {}</p>",
                escape(&e.to_string())
            );
        }
    }
    let shown: Vec<&Principal> = if access.covers_all() {
        state.principals.all().iter().collect()
    } else {
        vec![caller]
    };
    body.push_str(
        "<table><tr><th>token</th><th>groups</th><th>shards per group</th><th>members per group</th>\
         <th>requests/s</th><th>burst</th><th>available (this replica)</th></tr>",
    );
    for p in shown {
        let q = p.quota;
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&p.name),
            q.groups,
            q.shards_per_group,
            q.members_per_group,
            q.requests_per_second,
            q.request_burst,
            p.available()
        );
    }
    body.push_str("</table></section>");
}
