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
