//! The coordinator's HTTP routes: the path templates its router serves, and one function per route that builds
//! a concrete path for a client.
//!
//! The templates use axum's `{name}` placeholders and are what the coordinator's router and its OpenAPI
//! document list. The functions percent-encode every segment they are given, so a name that would not pass
//! [`names`](crate::names) validation (a typo in an operator's command line, say) still reaches the coordinator
//! as one segment and is refused there with a typed error, instead of changing which route is hit. Valid names
//! are left as they are: their characters (`[A-Za-z0-9._-]`) need no encoding.
//!
//! ```
//! use protocol::routes;
//!
//! assert_eq!(routes::heartbeat("orders", "billing"), "/v1/streams/orders/groups/billing/heartbeat");
//! assert_eq!(routes::HEARTBEAT, "/v1/streams/{stream}/groups/{group}/heartbeat");
//! assert_eq!(routes::group("bad/name", "g"), "/v1/streams/bad%2Fname/groups/g");
//! ```

use crate::messages::RoutingQuery;

/// `POST`: join, heartbeat or leave.
pub const HEARTBEAT: &str = "/v1/streams/{stream}/groups/{group}/heartbeat";
/// `GET`: producer routing fetch.
pub const ROUTING: &str = "/v1/streams/{stream}/routing";
/// `GET`: stream routing description.
pub const STREAM: &str = "/v1/streams/{stream}";
/// `POST`: add shards.
pub const SHARDS: &str = "/v1/streams/{stream}/shards";
/// `POST`: create, `GET`: describe a group.
pub const GROUP: &str = "/v1/streams/{stream}/groups/{group}";
/// `POST`: recreate a lost group.
pub const RECREATE: &str = "/v1/streams/{stream}/groups/{group}/recreate";
/// `DELETE`: fence a member.
pub const MEMBER: &str = "/v1/streams/{stream}/groups/{group}/members/{member}";
/// `POST`: fence a member.
pub const FENCE: &str = "/v1/streams/{stream}/groups/{group}/members/{member}/fence";
/// `GET`: list groups.
pub const GROUPS: &str = "/v1/groups";
/// `GET`: the quotas of the caller's token, with its usage.
pub const QUOTA: &str = "/v1/quota";
/// `GET`: liveness probe.
pub const HEALTHZ: &str = "/healthz";
/// `GET`: readiness probe.
pub const READYZ: &str = "/readyz";
/// `GET`: Prometheus metrics (text format).
pub const METRICS: &str = "/metrics";
/// `GET`: the operators' HTML status page.
pub const STATUS: &str = "/status";

/// Every route as (method, path template), in the order of the OpenAPI document.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", HEARTBEAT),
    ("GET", ROUTING),
    ("GET", STREAM),
    ("POST", SHARDS),
    ("POST", GROUP),
    ("GET", GROUP),
    ("POST", RECREATE),
    ("POST", FENCE),
    ("DELETE", MEMBER),
    ("GET", GROUPS),
    ("GET", QUOTA),
    ("GET", HEALTHZ),
    ("GET", READYZ),
    ("GET", METRICS),
    ("GET", STATUS),
];

/// One path segment, percent-encoded outside RFC 3986's `pchar` set (the same set the coordinator decodes).
fn segment(out: &mut String, value: &str) {
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Fills the `{...}` placeholders of `template`, in order, with `values` (each percent-encoded).
fn fill(template: &str, values: &[&str]) -> String {
    let mut out = String::with_capacity(template.len() + values.iter().map(|v| v.len()).sum::<usize>());
    let mut values = values.iter();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c + 1);
        let value = values.next().expect("one value per placeholder of a route template");
        segment(&mut out, value);
        rest = &rest[close..];
    }
    out.push_str(rest);
    debug_assert!(values.next().is_none(), "more values than placeholders");
    out
}

/// The path of [`HEARTBEAT`] for `stream` / `group`.
pub fn heartbeat(stream: &str, group: &str) -> String {
    fill(HEARTBEAT, &[stream, group])
}

/// The path of [`ROUTING`] for `stream`, without a query.
pub fn routing(stream: &str) -> String {
    fill(ROUTING, &[stream])
}

/// The path of [`ROUTING`] for `stream` with the producer's versions as the query string
/// (`?routingVersion=..&maxObservedVersion=..`).
pub fn routing_with(stream: &str, query: &RoutingQuery) -> String {
    let mut path = format!(
        "{}?routingVersion={}&maxObservedVersion={}",
        routing(stream),
        query.routing_version,
        query.max_observed_version
    );
    if query.max_shard_count > 0 {
        path.push_str(&format!("&maxShardCount={}", query.max_shard_count));
    }
    path
}

/// The path of [`STREAM`] for `stream`.
pub fn stream(stream: &str) -> String {
    fill(STREAM, &[stream])
}

/// The path of [`SHARDS`] for `stream`.
pub fn shards(stream: &str) -> String {
    fill(SHARDS, &[stream])
}

/// The path of [`GROUP`] for `stream` / `group`.
pub fn group(stream: &str, group: &str) -> String {
    fill(GROUP, &[stream, group])
}

/// The path of [`RECREATE`] for `stream` / `group`.
pub fn recreate(stream: &str, group: &str) -> String {
    fill(RECREATE, &[stream, group])
}

/// The path of [`MEMBER`] for `stream` / `group` / `member`.
pub fn member(stream: &str, group: &str, member: &str) -> String {
    fill(MEMBER, &[stream, group, member])
}

/// The path of [`FENCE`] for `stream` / `group` / `member`.
pub fn fence(stream: &str, group: &str, member: &str) -> String {
    fill(FENCE, &[stream, group, member])
}

/// The path of [`GROUPS`], with `?rebuild=true` when `rebuild` (rebuild the group index from a scan).
pub fn groups(rebuild: bool) -> String {
    if rebuild {
        format!("{GROUPS}?rebuild=true")
    } else {
        GROUPS.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RoutingVersion;

    #[test]
    fn every_function_fills_its_template() {
        assert_eq!(heartbeat("s", "g"), "/v1/streams/s/groups/g/heartbeat");
        assert_eq!(routing("s"), "/v1/streams/s/routing");
        assert_eq!(stream("s"), "/v1/streams/s");
        assert_eq!(shards("s"), "/v1/streams/s/shards");
        assert_eq!(group("s", "g"), "/v1/streams/s/groups/g");
        assert_eq!(recreate("s", "g"), "/v1/streams/s/groups/g/recreate");
        assert_eq!(member("s", "g", "m"), "/v1/streams/s/groups/g/members/m");
        assert_eq!(fence("s", "g", "m"), "/v1/streams/s/groups/g/members/m/fence");
        assert_eq!(groups(false), "/v1/groups");
        assert_eq!(groups(true), "/v1/groups?rebuild=true");
        let mut query = RoutingQuery {
            routing_version: RoutingVersion(3),
            max_observed_version: RoutingVersion(7),
            max_shard_count: 0,
        };
        assert_eq!(
            routing_with("s", &query),
            "/v1/streams/s/routing?routingVersion=3&maxObservedVersion=7"
        );
        query.max_shard_count = 8;
        assert_eq!(
            routing_with("s", &query),
            "/v1/streams/s/routing?routingVersion=3&maxObservedVersion=7&maxShardCount=8"
        );
    }

    #[test]
    fn a_segment_cannot_change_the_route() {
        assert_eq!(group("a/b", "g?x=1"), "/v1/streams/a%2Fb/groups/g%3Fx=1");
        assert_eq!(stream("50%"), "/v1/streams/50%25");
        assert_eq!(stream("é"), "/v1/streams/%C3%A9");
        assert_eq!(stream("{s}"), "/v1/streams/%7Bs%7D");
    }

    #[test]
    fn valid_names_are_not_encoded() {
        let name = "Orders-2024_v1.x";
        assert_eq!(stream(name), format!("/v1/streams/{name}"));
    }

    #[test]
    fn every_template_is_listed_once_per_method() {
        let mut seen = std::collections::BTreeSet::new();
        for &(method, path) in ROUTES {
            assert!(path.starts_with('/'), "{path}");
            assert!(seen.insert((method, path)), "{method} {path} listed twice");
        }
        assert_eq!(seen.len(), 15);
    }
}
