//! `GET /status`: a read-only HTML page for operators: groups, members, the shard ownership grid with fencing
//! tokens, pending and lag per shard, open correction rounds. Rendered here with `format!`, no script.
//!
//! Behind the admin token when one is set. A browser cannot easily send a bearer header, so this page alone also
//! takes the token as `?token=`; the token then shows in browser history and access logs of proxies, so prefer a
//! header-injecting proxy where that matters (docs/operations.md).

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{Html, IntoResponse, Response};
use protocol::messages::GroupDescription;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::auth::AuthRejection;
use super::extract::QueryParams;
use super::security_headers;
use super::state::AppState;
use crate::auth::{self, Role};
use crate::metrics::{shard_backlog, ShardBacklog};
use crate::recent::RecentEvent;

/// Groups shown at most: the page reads each one from Redis.
pub const MAX_GROUPS: usize = 50;
/// Longest `?token=` accepted (longer is refused before any comparison).
const MAX_TOKEN_LEN: usize = 4096;

/// Query of `GET /status`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatusQuery {
    /// The admin token, for browsers that cannot send a header.
    #[serde(default)]
    token: Option<String>,
}

/// Escapes `s` for HTML text and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `GET /status?token=`.
pub(super) async fn status(
    State(state): State<AppState>,
    headers: HeaderMap,
    QueryParams(query): QueryParams<StatusQuery>,
) -> Result<Response, AuthRejection> {
    let config = state.coordinator.config();
    let from_query = query
        .token
        .filter(|t| t.len() <= MAX_TOKEN_LEN)
        .map(|t| format!("Bearer {t}"));
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(from_query);
    let (access, who) =
        auth::authorize_as(config.credentials(), header.as_deref(), Role::Admin).map_err(AuthRejection::Denied)?;
    let list = state
        .coordinator
        .list_groups(false)
        .await
        .map_err(|e| AuthRejection::Api(e.into()))?;
    let refs: Vec<_> = list
        .groups
        .into_iter()
        .filter(|g| access.covers(g.stream.as_str()))
        .collect();
    let backlog = shard_backlog(state.coordinator.store()).await;
    let mut body = String::new();
    for g in refs.iter().take(MAX_GROUPS) {
        match state.coordinator.describe_group(&g.stream, &g.group).await {
            Ok(d) => render_group(&mut body, &d, backlog.as_ref()),
            Err(e) => {
                let _ = write!(
                    body,
                    "<section><h2>{} / {}</h2><p class=\"err\">unreadable: {}</p></section>",
                    escape(g.stream.as_str()),
                    escape(g.group.as_str()),
                    escape(&e.to_string())
                );
            }
        }
    }
    if refs.len() > MAX_GROUPS {
        let _ = write!(body, "<p>{} more groups not shown.</p>", refs.len() - MAX_GROUPS);
    }
    if refs.is_empty() {
        body.push_str("<p>No groups.</p>");
    }
    super::quota::render(&mut body, &state, who, &access).await;
    render_recent(&mut body, &state.coordinator.recent_rebalances(), |stream| {
        access.covers(stream)
    });
    let usage = state.coordinator.tenant_usage().await;
    super::status_usage::render_usage(&mut body, usage.as_deref(), &access);
    let nonce = security_headers::nonce();
    let mut response = Html(page(&body, &nonce)).into_response();
    security_headers::status_page(&mut response, &nonce);
    Ok(response)
}

/// The page around `body`; its one inline style carries `nonce`, the only style the page's CSP allows.
fn page(body: &str, nonce: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>redis-stream-coord status</title>\
         <style nonce=\"{nonce}\">body{{font-family:sans-serif;margin:1em}}table{{border-collapse:collapse;margin:.5em 0}}\
         td,th{{border:1px solid #999;padding:2px 6px;text-align:left}}.err{{color:#b00}}\
         .moving{{background:#ffd}}.unowned{{background:#fdd}}</style></head>\
         <body><h1>redis-stream-coord status</h1>{body}</body></html>\n"
    )
}

/// The last rebalance events of this instance (newest first), limited to the streams the token reaches.
fn render_recent(body: &mut String, events: &[RecentEvent], covers: impl Fn(&str) -> bool) {
    body.push_str("<section><h2>Recent rebalances (this instance)</h2>");
    let shown: Vec<&RecentEvent> = events.iter().filter(|e| covers(e.stream.as_str())).collect();
    if shown.is_empty() {
        body.push_str("<p>None since this instance started.</p></section>");
        return;
    }
    body.push_str("<table><tr><th>time (UTC)</th><th>group</th><th>event</th></tr>");
    for e in shown {
        let secs = e.at_unix_ms / 1000;
        let _ = write!(
            body,
            "<tr><td>{:02}:{:02}:{:02}.{:03}</td><td>{} / {}</td><td>{}</td></tr>",
            secs / 3600 % 24,
            secs / 60 % 60,
            secs % 60,
            e.at_unix_ms % 1000,
            escape(e.stream.as_str()),
            escape(e.group.as_str()),
            escape(&e.what)
        );
    }
    body.push_str("</table></section>");
}

fn opt(v: Option<impl std::fmt::Display>) -> String {
    v.map(|v| escape(&v.to_string())).unwrap_or_else(|| "-".into())
}

fn render_group(
    out: &mut String,
    d: &GroupDescription,
    backlog: Option<&BTreeMap<(String, String, u32), ShardBacklog>>,
) {
    let stream = d.stream.as_str();
    let group = d.group.as_str();
    let _ = write!(
        out,
        "<section class=\"group\"><h2>{} / {}</h2><p>metadata version {}, assignment epoch {}, routing version {}, \
         {} shards</p>",
        escape(stream),
        escape(group),
        d.metadata_version,
        d.assignment_epoch,
        d.routing_version,
        d.shard_count
    );
    out.push_str("<h3>Members</h3><table><tr><th>member</th><th>epoch</th><th>instance</th><th>fenced</th><th>assigned</th><th>pending</th><th>revoke</th></tr>");
    for m in &d.members {
        let list = |s: &[protocol::ShardId]| s.iter().map(|s| s.0.to_string()).collect::<Vec<_>>().join(" ");
        let _ = write!(
            out,
            "<tr class=\"member\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(m.member_id.as_str()),
            m.epoch,
            escape(&m.instance_id),
            m.fenced,
            list(&m.assigned),
            list(&m.pending),
            list(&m.revoke)
        );
    }
    out.push_str("</table><h3>Shards</h3><table><tr><th>shard</th><th>owner</th><th>target</th><th>fencing token</th><th>pending</th><th>lag</th></tr>");
    for s in &d.shards {
        let class = match (&s.owner, &s.target) {
            (None, _) => "unowned",
            (o, t) if o != t => "moving",
            _ => "",
        };
        let b = backlog.and_then(|b| b.get(&(stream.to_owned(), group.to_owned(), s.shard.0)));
        let _ = write!(
            out,
            "<tr class=\"shard {class}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            s.shard.0,
            opt(s.owner.as_ref().map(|m| m.as_str())),
            opt(s.target.as_ref().map(|m| m.as_str())),
            s.fencing_token,
            opt(b.map(|b| b.pending)),
            opt(b.and_then(|b| b.lag))
        );
    }
    out.push_str("</table>");
    if let Some(c) = &d.correction {
        let ids = |v: &[protocol::names::MemberId]| escape(&v.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(" "));
        let _ = write!(
            out,
            "<h3>Correction round</h3><p class=\"correction\">open since {} ms (Redis time), reported version {}, \
             synced: {}, unsynced: {}</p>",
            c.started_at_ms,
            c.reported_max_version,
            ids(&c.synced),
            ids(&c.unsynced)
        );
    }
    out.push_str("</section>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_neutralises_markup() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(escape("plain-name_1"), "plain-name_1");
    }
}
