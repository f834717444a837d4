//! `GET /status`: the operators' HTML page against a real Redis and a running group, behind the admin token.

mod common;

use common::{config, join, Api};
use coord_server::server::CoordinatorHandle;
use reqwest::header::AUTHORIZATION;
use reqwest::StatusCode;
use test_support::RedisServer;

const S: &str = "orders";
const G: &str = "billing";
const TOKEN: &str = "admin-secret";

async fn start_protected() -> (RedisServer, CoordinatorHandle) {
    let redis = RedisServer::start().await;
    let mut c = config(&redis.url());
    c.admin_token = Some(TOKEN.into());
    let coord = CoordinatorHandle::spawn(c).await.expect("coordinator starts");
    (redis, coord)
}

async fn page(url: &str) -> (StatusCode, String) {
    let resp = reqwest::get(url).await.expect("request sent");
    let status = resp.status();
    (status, resp.text().await.expect("body"))
}

/// The shard row of `shard` in `html` (the page has one group here).
fn shard_row(html: &str, shard: u32) -> &str {
    let start = html
        .find("<tr class=\"shard")
        .and_then(|first| html[first..].find(&format!("<td>{shard}</td>")).map(|i| first + i))
        .expect("shard row");
    let end = html[start..].find("</tr>").expect("row end") + start;
    &html[start..end]
}

#[tokio::test]
async fn the_page_shows_groups_members_owners_and_backlog_behind_the_admin_token() {
    let (redis, coord) = start_protected().await;
    let api = Api::new(coord.url()).with_token(TOKEN);
    api.create_group(S, G, 2).await;
    let first = api.hb(S, G, &join("alpha")).await;
    let owned = first.assigned.clone();
    assert!(!owned.is_empty(), "the first member owns shards: {first:?}");
    api.hb(S, G, &join("beta")).await;

    // One entry delivered and not acknowledged, two not delivered, on shard 1.
    let key = protocol::keys::shard_stream(
        &protocol::names::StreamName::new(S).expect("stream"),
        protocol::ShardId(1),
    );
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&key)
        .arg(G)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("XGROUP CREATE");
    for i in 0..3 {
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("n")
            .arg(i)
            .query_async(&mut conn)
            .await
            .expect("XADD");
    }
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(G)
        .arg("c")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(&key)
        .arg(">")
        .query_async(&mut conn)
        .await
        .expect("XREADGROUP");

    let base = format!("{}/status", coord.url());
    let (status, _) = page(&base).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no token");
    let (status, _) = page(&format!("{base}?token=wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "wrong token");

    let (status, html) = page(&format!("{base}?token={TOKEN}")).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains(&format!("<h2>{S} / {G}</h2>")), "{html}");
    assert!(html.contains("<tr class=\"member\"><td>alpha</td>"), "{html}");
    assert!(html.contains("<tr class=\"member\"><td>beta</td>"), "{html}");
    for shard in &owned {
        let row = shard_row(&html, shard.0);
        assert!(
            row.contains("<td>alpha</td>"),
            "shard {} owned by alpha: {row}",
            shard.0
        );
    }
    let row = shard_row(&html, 1);
    assert!(row.ends_with("<td>1</td><td>2</td>"), "pending 1, lag 2: {row}");
    assert!(!html.contains("<script"), "{html}");
    let recent = &html[html.find("Recent rebalances").expect("a recent-rebalances section")..];
    assert!(
        recent.contains("member alpha joined") && recent.contains("member beta joined"),
        "{recent}"
    );
    assert!(recent.contains("granted to alpha"), "{recent}");

    // The header works too, as on every admin route.
    let resp = reqwest::Client::new()
        .get(&base)
        .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("request sent");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.text().await.expect("body").contains("alpha"));
    coord.shutdown().await;
}

/// The value of header `name` of `resp`, or a panic naming it.
fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name}: {:?}", resp.headers()))
        .to_str()
        .expect("ASCII header")
}

#[tokio::test]
async fn the_page_forbids_scripts_framing_caching_and_sniffing_and_its_style_carries_the_nonce() {
    let (_redis, coord) = start_protected().await;
    let base = format!("{}/status?token={TOKEN}", coord.url());
    let mut nonces = Vec::new();
    for _ in 0..2 {
        let resp = reqwest::get(&base).await.expect("request sent");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "x-content-type-options"), "nosniff");
        assert_eq!(header(&resp, "cache-control"), "no-store");
        assert_eq!(
            header(&resp, "referrer-policy"),
            "no-referrer",
            "the URL carries the token"
        );
        let csp = header(&resp, "content-security-policy").to_owned();
        let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
        for d in [
            "default-src 'none'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
            "form-action 'none'",
        ] {
            assert!(directives.contains(&d), "{d} missing: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{csp}");
        let style = directives
            .iter()
            .find_map(|d| d.strip_prefix("style-src 'nonce-"))
            .and_then(|n| n.strip_suffix('\''))
            .unwrap_or_else(|| panic!("style-src by nonce: {csp}"));
        let html = resp.text().await.expect("body");
        // Every inline style element carries the nonce the policy names, so the browser applies it.
        assert_eq!(
            html.matches("<style").count(),
            html.matches(&format!("<style nonce=\"{style}\">")).count(),
            "{html}"
        );
        assert!(html.contains("<style nonce="), "{html}");
        nonces.push(style.to_owned());
    }
    assert_ne!(nonces[0], nonces[1], "a nonce is never reused");
    // Every other answer is not sniffed either, refusals included.
    for path in ["/healthz", "/metrics", "/status", "/v1/groups", "/nowhere"] {
        let resp = reqwest::get(format!("{}{path}", coord.url()))
            .await
            .expect("request sent");
        assert_eq!(header(&resp, "x-content-type-options"), "nosniff", "{path}");
    }
    coord.shutdown().await;
}
