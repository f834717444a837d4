//! The server accepts exactly what `openapi.json` allows, in the cases schemathesis found apart: integers
//! written `N.0`, the `If-Match` pattern, `instanceId` as visible ASCII, and version bounds in the routing query.
//! (scripts/schemathesis.sh checks the whole document; these pin each case in the ordinary test run.)

mod common;

use common::*;
use protocol::messages::{GroupDescription, HeartbeatResponse, RoutingDescription};
use protocol::Status;
use reqwest::header::{CONTENT_TYPE, IF_MATCH};
use reqwest::StatusCode;

const S: &str = "orders";
const G: &str = "billing";
const HB: &str = "/v1/streams/orders/groups/billing/heartbeat";

async fn post_raw(api: &Api, path: &str, body: &str) -> reqwest::Response {
    api.http
        .post(format!("{}{path}", api.base))
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("request sent")
}

#[tokio::test]
async fn integers_written_with_a_zero_fraction_are_accepted_and_other_fractions_refused() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    let created = post_raw(
        &api,
        "/v1/streams/orders/groups/billing",
        r#"{"shardCount": 4.0, "timings": {"memberTtlMs": 2000.0, "heartbeatIntervalMs": 200, "rebalanceTimeoutMs": 3000.0, "assignmentLeaseMs": 1500.0}}"#,
    )
    .await;
    let group: GroupDescription = ok_json(created, StatusCode::CREATED).await;
    assert_eq!(group.shard_count, 4);
    assert_eq!(group.timings.member_ttl_ms, 2000);

    let joined = post_raw(
        &api,
        HB,
        r#"{"memberId": "a", "instanceId": "i-1", "incarnation": 0.0, "memberEpoch": 0.0, "metadataVersion": 0.0, "maxObservedVersion": 0, "owned": [1.0]}"#,
    )
    .await;
    let answer: HeartbeatResponse = ok_json(joined, StatusCode::OK).await;
    assert_eq!(answer.member_id.as_str(), "a");

    for bad in [
        r#"{"memberId": "b", "instanceId": "i-2", "incarnation": 0, "memberEpoch": 0.5, "metadataVersion": 0, "maxObservedVersion": 0}"#,
        // Beyond 2^53 a float is not an exact integer in every JSON implementation.
        r#"{"memberId": "b", "instanceId": "i-2", "incarnation": 0, "memberEpoch": 0, "metadataVersion": 9007199254740994.0, "maxObservedVersion": 0}"#,
    ] {
        let refused = post_raw(&api, HB, bad).await;
        let body = error_json(refused, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;
        assert!(
            body.message.contains("metadataVersion") || body.message.contains("memberEpoch"),
            "{body:?}"
        );
    }
    assert_eq!(
        api.describe(S, G).await.members.len(),
        1,
        "nothing joined from a refused request"
    );
}

#[tokio::test]
async fn a_client_of_the_protocol_before_incarnations_is_told_to_upgrade_and_changes_nothing() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let refused = post_raw(
        &api,
        HB,
        r#"{"memberId": "a", "instanceId": "i-1", "memberEpoch": 0, "metadataVersion": 0, "maxObservedVersion": 0}"#,
    )
    .await;
    let body = error_json(refused, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;
    assert!(
        body.message.contains("missing field `incarnation`") && body.message.contains("upgrade the consumer SDK"),
        "{body:?}"
    );
    assert!(api.describe(S, G).await.members.is_empty(), "nothing joined");
}

#[tokio::test]
async fn if_match_is_exactly_a_quoted_or_bare_revision_of_at_most_19_digits() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let before: RoutingDescription = ok_json(api.get("/v1/streams/orders").await, StatusCode::OK).await;
    for bad in ["+1", "\"+1\"", "12345678901234567890", "W/\"1\"", "1, 2"] {
        let refused = api
            .request(reqwest::Method::POST, "/v1/streams/orders/shards")
            .header(IF_MATCH, bad)
            .json(&serde_json::json!({"count": 1}))
            .send()
            .await
            .unwrap();
        error_json(refused, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;
    }
    // An impossible count is refused as such, even with a stale If-Match (not 412).
    let refused = api
        .request(reqwest::Method::POST, "/v1/streams/orders/shards")
        .header(IF_MATCH, "\"999\"")
        .json(&serde_json::json!({"count": 65536}))
        .send()
        .await
        .unwrap();
    error_json(refused, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;
    let after: RoutingDescription = ok_json(api.get("/v1/streams/orders").await, StatusCode::OK).await;
    assert_eq!(after, before, "no refused If-Match added shards");
    let added = api
        .request(reqwest::Method::POST, "/v1/streams/orders/shards")
        .header(IF_MATCH, before.revision.0.to_string())
        .json(&serde_json::json!({"count": 1}))
        .send()
        .await
        .unwrap();
    let grown: RoutingDescription = ok_json(added, StatusCode::OK).await;
    assert_eq!(grown.shard_count, 3);
}

#[tokio::test]
async fn instance_id_is_visible_ascii_so_its_length_is_the_same_in_characters_and_bytes() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    // 64 characters, as the document counts, but 128 bytes; and a space.
    for bad in ["é".repeat(64), "has space".to_owned(), String::new()] {
        let mut req = join("a");
        req.instance_id = bad;
        let refused = api.post(HB, &req).await;
        let body = error_json(refused, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;
        assert!(body.message.contains("instanceId"), "{body:?}");
    }
    let mut req = join("a");
    req.instance_id = "~".repeat(64);
    let _: HeartbeatResponse = ok_json(api.post(HB, &req).await, StatusCode::OK).await;
}

#[tokio::test]
async fn routing_query_versions_are_bounded_like_heartbeat_versions() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    for query in [
        "routingVersion=9223372036854775808",
        "maxObservedVersion=9007199254740992",
    ] {
        let refused = api.get(&format!("/v1/streams/orders/routing?{query}")).await;
        error_json(refused, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;
    }
    let ok = api
        .get("/v1/streams/orders/routing?maxObservedVersion=9007199254740991")
        .await;
    assert_eq!(ok.status(), StatusCode::OK);
}
