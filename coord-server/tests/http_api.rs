//! The HTTP API against a real Redis: status codes, typed errors, ETags, the rebalance handshake, fail-closed
//! metadata loss, rollback detection and tokens (two coordinators at once: `http_concurrency.rs`).

mod common;

use common::*;
use coord_server::server::CoordinatorHandle;
use coord_server::stats::Stats;
use protocol::messages::{
    AddShardsRequest, GroupDescription, GroupList, RecreateGroupRequest, RoutingDescription, RoutingResponse,
};
use protocol::{MemberEpoch, Status};
use reqwest::header::{CONTENT_TYPE, ETAG, IF_MATCH, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use std::time::Duration;
use test_support::{wait_for, wait_until, RedisServer};

const S: &str = "orders";
const G: &str = "billing";
const HB: &str = "/v1/streams/orders/groups/billing/heartbeat";
const WAIT: Duration = Duration::from_secs(10);

fn etag_of(resp: &reqwest::Response) -> String {
    resp.headers()
        .get(ETAG)
        .expect("ETag header")
        .to_str()
        .expect("ASCII ETag")
        .to_owned()
}

#[tokio::test]
async fn create_group_answers_201_with_etag_and_a_duplicate_is_409() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    let body = protocol::messages::CreateGroupRequest {
        shard_count: Some(4),
        timings: Some(timings()),
    };
    let resp = api.post("/v1/streams/orders/groups/billing", &body).await;
    let etag = etag_of(&resp);
    let created: GroupDescription = ok_json(resp, StatusCode::CREATED).await;
    assert_eq!(etag, format!("\"{}\"", created.revision.0));
    assert_eq!(created.shard_count, 4);
    assert_eq!(created.timings, timings());
    assert!(created.members.is_empty());

    let resp = api.get("/v1/streams/orders/groups/billing").await;
    assert_eq!(etag_of(&resp), etag, "an unchanged group keeps its ETag");

    let again = api.post("/v1/streams/orders/groups/billing", &body).await;
    error_json(again, StatusCode::CONFLICT, Status::AlreadyExists).await;

    let list: GroupList = ok_json(api.get("/v1/groups").await, StatusCode::OK).await;
    assert_eq!(list.groups.len(), 1);
    assert_eq!(list.groups[0].group.as_str(), G);
    coord.shutdown().await;
}

#[tokio::test]
async fn rebalance_hands_shards_over_only_after_revoked() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 4).await;

    let a1 = api.hb(S, G, &join("a")).await;
    assert_eq!(a1.status, Status::Ok);
    assert_eq!(a1.assigned, shards(&[0, 1, 2, 3]), "a lone member gets every shard");
    assert!(a1.pending.is_empty() && a1.revoke.is_empty());
    let a_reading = reading_after(&a1, &[]);

    let b1 = api.hb(S, G, &join("b")).await;
    assert_eq!(b1.status, Status::Ok);
    assert!(b1.assigned.is_empty(), "a still owns every shard: {b1:?}");
    assert_eq!(b1.pending.len(), 2, "{b1:?}");

    let a2 = api.hb(S, G, &follow_up(&a1, &a_reading)).await;
    assert_eq!(a2.revoke, b1.pending, "a must drain exactly what b waits for");
    let a_reading = reading_after(&a2, &a_reading);
    assert_eq!(a_reading.len(), 2);

    let b2 = api.hb(S, G, &follow_up(&b1, &[])).await;
    assert!(b2.assigned.is_empty(), "no hand-over before a reports REVOKED: {b2:?}");
    assert_eq!(b2.pending, b1.pending);

    // The REVOKED report, sent twice (a lost answer): both answers are the same recorded view.
    let ack = follow_up(&a2, &a_reading);
    let a3 = api.hb(S, G, &ack).await;
    let a3_again = api.hb(S, G, &ack).await;
    assert_eq!(a3, a3_again, "the same heartbeat gets the same answer");
    assert_eq!(a3.assigned, a_reading);
    assert!(a3.revoke.is_empty());

    let b3 = api.hb(S, G, &follow_up(&b2, &[])).await;
    assert_eq!(b3.status, Status::Ok);
    assert_eq!(b3.assigned, b1.pending, "b gets the released shards");
    assert!(b3.pending.is_empty());

    let group = api.describe(S, G).await;
    assert_eq!(group.members.len(), 2);
    for shard in &group.shards {
        assert_eq!(shard.owner, shard.target, "settled: {group:?}");
    }
    coord.shutdown().await;
}

#[tokio::test]
async fn stale_epoch_is_fenced_and_unknown_member_is_refused() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 4).await;
    let a1 = api.hb(S, G, &join("a")).await;
    let b1 = api.hb(S, G, &join("b")).await;
    let a2 = api.hb(S, G, &follow_up(&a1, &a1.assigned)).await;
    let a_reading = reading_after(&a2, &a1.assigned);
    let a3 = api.hb(S, G, &follow_up(&a2, &a_reading)).await;
    assert!(
        a3.member_epoch > a1.member_epoch,
        "the epoch moved once a drained: {a1:?} {a3:?}"
    );
    let _ = b1;

    // An old incarnation's view: the first epoch, still claiming every shard.
    let mut stale = follow_up(&a1, &shards(&[0, 1, 2, 3]));
    stale.revoking.clear();
    let resp = api.post(HB, &stale).await;
    let body = error_json(resp, StatusCode::CONFLICT, Status::FencedMemberEpoch).await;
    assert_eq!(
        body.member_epoch,
        Some(a3.member_epoch),
        "the answer names the recorded epoch"
    );

    let mut never_issued = follow_up(&a3, &a3.assigned);
    never_issued.member_epoch = MemberEpoch(a3.member_epoch.0 + 10);
    error_json(
        api.post(HB, &never_issued).await,
        StatusCode::CONFLICT,
        Status::FencedMemberEpoch,
    )
    .await;

    let mut ghost = join("ghost");
    ghost.member_epoch = MemberEpoch(3);
    let body = error_json(api.post(HB, &ghost).await, StatusCode::CONFLICT, Status::UnknownMember).await;
    assert!(body.message.contains("ghost"), "{body:?}");

    // The refusals changed nothing: a still heartbeats with its epoch.
    let a4 = api.hb(S, G, &follow_up(&a3, &a3.assigned)).await;
    assert_eq!(a4.assigned, a3.assigned);
    coord.shutdown().await;
}

#[tokio::test]
async fn admin_fence_by_post_or_delete_checks_if_match() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let a1 = api.hb(S, G, &join("a")).await;
    api.hb(S, G, &join("b")).await;

    let resp = api.get("/v1/streams/orders/groups/billing").await;
    let etag = etag_of(&resp);
    let group: GroupDescription = ok_json(resp, StatusCode::OK).await;
    let stale = format!("\"{}\"", group.revision.0 + 7);
    let fence_a = "/v1/streams/orders/groups/billing/members/a/fence";

    let resp = api
        .request(Method::POST, fence_a)
        .header(IF_MATCH, &stale)
        .send()
        .await
        .unwrap();
    error_json(resp, StatusCode::PRECONDITION_FAILED, Status::RevisionConflict).await;
    let resp = api
        .request(Method::POST, fence_a)
        .header(IF_MATCH, "not-a-revision")
        .send()
        .await
        .unwrap();
    error_json(resp, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;

    let resp = api
        .request(Method::POST, fence_a)
        .header(IF_MATCH, &etag)
        .send()
        .await
        .unwrap();
    let fenced: GroupDescription = ok_json(resp, StatusCode::OK).await;
    let a = fenced
        .members
        .iter()
        .find(|m| m.member_id.as_str() == "a")
        .expect("a listed");
    assert!(a.fenced, "{fenced:?}");
    let refused = api.post(HB, &follow_up(&a1, &a1.assigned)).await;
    error_json(refused, StatusCode::CONFLICT, Status::FencedMemberEpoch).await;

    // DELETE on the member is the same operation; without If-Match there is no precondition.
    let resp = api
        .request(Method::DELETE, "/v1/streams/orders/groups/billing/members/b")
        .send()
        .await
        .unwrap();
    let fenced: GroupDescription = ok_json(resp, StatusCode::OK).await;
    assert!(fenced.members.iter().all(|m| m.fenced), "{fenced:?}");

    let resp = api
        .request(Method::DELETE, "/v1/streams/orders/groups/billing/members/ghost")
        .send()
        .await
        .unwrap();
    error_json(resp, StatusCode::CONFLICT, Status::UnknownMember).await;
    coord.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_get_typed_errors_and_change_nothing() {
    let redis = RedisServer::start().await;
    let mut config = config(&redis.url());
    config.body_limit_bytes = 4096;
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let before = api.describe(S, G).await;

    let raw = |body: &str, content_type: &str| {
        api.request(Method::POST, HB)
            .header(CONTENT_TYPE, content_type)
            .body(body.to_owned())
            .send()
    };
    let bad = StatusCode::BAD_REQUEST;
    let invalid = Status::InvalidRequest;

    error_json(raw("{\"memberId\":", "application/json").await.unwrap(), bad, invalid).await;
    let mut unknown_field = serde_json::to_value(join("a")).unwrap();
    unknown_field["shardz"] = serde_json::json!([1]);
    let body = error_json(api.post(HB, &unknown_field).await, bad, invalid).await;
    assert!(body.message.contains("shardz"), "{body:?}");
    let valid = serde_json::to_string(&join("a")).unwrap();
    error_json(raw(&valid, "text/plain").await.unwrap(), bad, invalid).await;
    error_json(api.request(Method::POST, HB).send().await.unwrap(), bad, invalid).await;
    let bad_member = valid.replace("\"memberId\":\"a\"", "\"memberId\":\"a:b\"");
    error_json(raw(&bad_member, "application/json").await.unwrap(), bad, invalid).await;
    let body = error_json(
        api.post("/v1/streams/bad:name/groups/billing/heartbeat", &join("a"))
            .await,
        bad,
        invalid,
    )
    .await;
    assert!(body.message.contains("stream"), "{body:?}");
    let long = "x".repeat(200);
    error_json(api.get(&protocol::routes::group("orders", &long)).await, bad, invalid).await;

    // The general limit (4096 here) for every route but the heartbeat, which takes the protocol's bound.
    let mut huge = join("a");
    huge.instance_id = "x".repeat(protocol::messages::MAX_HEARTBEAT_REQUEST_BYTES);
    error_json(api.post(HB, &huge).await, StatusCode::PAYLOAD_TOO_LARGE, invalid).await;
    huge.instance_id = "x".repeat(8192);
    error_json(api.post(HB, &huge).await, bad, invalid).await;
    let padded = serde_json::json!({ "count": 1, "pad": "x".repeat(8192) });
    error_json(
        api.post("/v1/streams/orders/shards", &padded).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        invalid,
    )
    .await;

    let resp = api
        .request(Method::POST, "/v1/streams/orders/shards")
        .header(IF_MATCH, "W/\"1\"");
    error_json(
        resp.json(&AddShardsRequest { count: 1 }).send().await.unwrap(),
        bad,
        invalid,
    )
    .await;
    error_json(
        api.get("/v1/streams/orders/routing?routingVersion=abc").await,
        bad,
        invalid,
    )
    .await;
    error_json(api.get("/v1/streams/orders/routing?bogus=1").await, bad, invalid).await;
    error_json(api.get("/v1/groups?rebuild=maybe").await, bad, invalid).await;
    error_json(api.get("/v1/nothing/here").await, StatusCode::NOT_FOUND, invalid).await;
    error_json(api.get(HB).await, StatusCode::METHOD_NOT_ALLOWED, invalid).await;
    // The state machine's own validation, after decoding succeeded.
    let mut empty_instance = join("a");
    empty_instance.instance_id.clear();
    error_json(api.post(HB, &empty_instance).await, bad, invalid).await;

    let after = api.describe(S, G).await;
    assert_eq!(after.revision, before.revision, "no refused request wrote anything");
    assert!(after.members.is_empty());
    let routing: RoutingDescription = ok_json(api.get("/v1/streams/orders").await, StatusCode::OK).await;
    assert_eq!(routing.shard_count, 2);
    coord.shutdown().await;
}

#[tokio::test]
async fn null_for_an_optional_field_is_refused_as_openapi_json_says() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    let create = protocol::routes::group(S, G);
    let recreate = protocol::routes::recreate(S, G);
    let refused = [
        (
            &create,
            serde_json::json!({ "shardCount": 2, "timings": null }),
            "timings",
        ),
        (
            &create,
            serde_json::json!({ "shardCount": null, "timings": timings() }),
            "shardCount",
        ),
        (
            &recreate,
            serde_json::json!({ "confirm": true, "shardCount": 2, "timings": null }),
            "timings",
        ),
    ];
    for (path, body, field) in refused {
        let answer = error_json(
            api.post(path, &body).await,
            StatusCode::BAD_REQUEST,
            Status::InvalidRequest,
        )
        .await;
        assert!(answer.message.contains(field), "{body}: {answer:?}");
    }
    let left = redis.snapshot_keys("*billing*").await;
    assert!(
        left.is_empty(),
        "a refused body writes nothing: {:?}",
        left.keys().collect::<Vec<_>>()
    );
    // Absent is the way to ask for the defaults.
    let resp = api.post(&create, &serde_json::json!({ "shardCount": 2 })).await;
    let created: GroupDescription = ok_json(resp, StatusCode::CREATED).await;
    assert_eq!(created.timings, coord.coordinator().config().default_timings);
    coord.shutdown().await;
}

#[tokio::test]
async fn lost_metadata_fails_closed_until_recreated() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let a1 = api.hb(S, G, &join("a")).await;

    let stats = coord.coordinator().stats();
    let before_loss = Stats::get(&stats.metadata_unavailable);
    let mut con = redis.connection().await;
    let key = metadata_key(S, G);
    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut con).await.unwrap();

    let resp = api.post(HB, &follow_up(&a1, &a1.assigned)).await;
    let retry_after = resp.headers().get(RETRY_AFTER).cloned();
    let body = error_json(resp, StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable).await;
    assert!(body.retry_after_ms.is_some() && retry_after.is_some(), "{body:?}");
    error_json(
        api.post(HB, &join("c")).await,
        StatusCode::SERVICE_UNAVAILABLE,
        Status::MetadataUnavailable,
    )
    .await;

    // Ticks meet the missing key too (each counts as unavailable) and must not recreate it either. The group is
    // due (its member's gauges are refreshed every half TTL); once found lost it leaves the due index, and only the
    // safety sweep visits it again (see `coord_server::due`), so one visit is what a test can wait for. That visit
    // may come before the heartbeats above: each of the two counts once, so a third count is the tick's.
    wait_until(WAIT, "a tick to visit the lost group", || async {
        Stats::get(&stats.metadata_unavailable) >= before_loss + 3
    })
    .await;
    let exists: i64 = redis::cmd("EXISTS").arg(&key).query_async(&mut con).await.unwrap();
    assert_eq!(exists, 0, "neither heartbeats nor ticks rebuild lost metadata");

    let described = api.get("/v1/streams/orders/groups/billing").await;
    error_json(described, StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable).await;
    let create = protocol::messages::CreateGroupRequest {
        shard_count: Some(2),
        timings: None,
    };
    let body = error_json(
        api.post("/v1/streams/orders/groups/billing", &create).await,
        StatusCode::CONFLICT,
        Status::AlreadyExists,
    )
    .await;
    assert!(body.message.contains("recreate"), "{body:?}");

    let recreate_path = "/v1/streams/orders/groups/billing/recreate";
    let mut recreate = RecreateGroupRequest {
        confirm: false,
        shard_count: 2,
        timings: Some(timings()),
    };
    error_json(
        api.post(recreate_path, &recreate).await,
        StatusCode::BAD_REQUEST,
        Status::InvalidRequest,
    )
    .await;
    recreate.confirm = true;
    let resp = api.post(recreate_path, &recreate).await;
    assert!(resp.headers().contains_key(ETAG));
    let group: GroupDescription = ok_json(resp, StatusCode::CREATED).await;
    assert!(group.members.is_empty());
    error_json(
        api.post(recreate_path, &recreate).await,
        StatusCode::CONFLICT,
        Status::AlreadyExists,
    )
    .await;

    // The lost group's member is unknown to the new one and rejoins.
    error_json(
        api.post(HB, &follow_up(&a1, &a1.assigned)).await,
        StatusCode::CONFLICT,
        Status::UnknownMember,
    )
    .await;
    let rejoined = api.hb(S, G, &join("a")).await;
    assert!(
        matches!(rejoined.status, Status::Ok | Status::RevokePending),
        "{rejoined:?}"
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn add_shards_checks_if_match_and_groups_adopt_on_tick() {
    let (_redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;

    let resp = api.get("/v1/streams/orders").await;
    let etag = etag_of(&resp);
    let before: RoutingDescription = ok_json(resp, StatusCode::OK).await;
    assert_eq!(etag, format!("\"{}\"", before.revision.0));

    let add = AddShardsRequest { count: 2 };
    let stale = format!("\"{}\"", before.revision.0 + 1);
    let resp = api
        .request(Method::POST, "/v1/streams/orders/shards")
        .header(IF_MATCH, stale);
    error_json(
        resp.json(&add).send().await.unwrap(),
        StatusCode::PRECONDITION_FAILED,
        Status::RevisionConflict,
    )
    .await;
    let zero = api
        .post("/v1/streams/orders/shards", &AddShardsRequest { count: 0 })
        .await;
    error_json(zero, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;

    let resp = api
        .request(Method::POST, "/v1/streams/orders/shards")
        .header(IF_MATCH, &etag);
    let resp = resp.json(&add).send().await.unwrap();
    let new_etag = etag_of(&resp);
    let after: RoutingDescription = ok_json(resp, StatusCode::OK).await;
    assert_eq!(after.routing_version, before.routing_version.next());
    assert_eq!(after.shard_count, 4);
    assert_ne!(new_etag, etag);
    // The bare revision is accepted as If-Match too.
    let resp = api
        .request(Method::POST, "/v1/streams/orders/shards")
        .header(IF_MATCH, before.revision.0.to_string());
    error_json(
        resp.json(&add).send().await.unwrap(),
        StatusCode::PRECONDITION_FAILED,
        Status::RevisionConflict,
    )
    .await;

    let group = wait_for(WAIT, "the group to adopt the new routing", || async {
        let g = api.describe(S, G).await;
        (g.shard_count == 4).then_some(g)
    })
    .await;
    assert_eq!(group.routing_version, after.routing_version);
    assert_eq!(group.shards.len(), 4);

    let routing: RoutingResponse = ok_json(api.get("/v1/streams/orders/routing").await, StatusCode::OK).await;
    assert_eq!((routing.status, routing.shard_count), (Status::Ok, 4));
    coord.shutdown().await;
}

#[tokio::test]
async fn rolled_back_metadata_answers_sync_metadata_with_the_older_version() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 4).await;
    let a1 = api.hb(S, G, &join("a")).await;
    let pattern = format!("redis-stream:coord:{{{S}:{G}}}:*");
    let snapshot = redis.snapshot_keys(&pattern).await;
    assert!(
        snapshot.contains(&metadata_key(S, G)),
        "{:?}",
        snapshot.keys().collect::<Vec<_>>()
    );

    api.hb(S, G, &join("b")).await;
    let a2 = api.hb(S, G, &follow_up(&a1, &a1.assigned)).await;
    assert!(a2.metadata_version > a1.metadata_version, "{a1:?} {a2:?}");

    redis.restore_snapshot(&snapshot).await;

    let after_rollback = follow_up(&a2, &reading_after(&a2, &a1.assigned));
    let sync = api.hb(S, G, &after_rollback).await;
    assert_eq!(sync.status, Status::SyncMetadata, "{sync:?}");
    assert_eq!(
        sync.metadata_version, a1.metadata_version,
        "the answer carries the older, stored version"
    );
    let again = api.hb(S, G, &after_rollback).await;
    assert_eq!(again.status, Status::SyncMetadata, "a lost SYNC_METADATA is repeated");
    assert_eq!(again.metadata_version, a1.metadata_version);

    let group = api.describe(S, G).await;
    assert_eq!(
        group.metadata_version, a1.metadata_version,
        "Redis is never bumped to match a client"
    );
    assert!(group.correction.is_some(), "{group:?}");
    assert!(Stats::get(&coord.coordinator().stats().client_version_ahead) >= 1);
    coord.shutdown().await;
}

#[tokio::test]
async fn tokens_are_required_when_configured() {
    let redis = RedisServer::start().await;
    let mut config = config(&redis.url());
    config.admin_token = Some("admin-secret".into());
    config.client_token = Some("client-secret".into());
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let anonymous = Api::new(coord.url());
    let admin = Api::new(coord.url()).with_token("admin-secret");
    let client = Api::new(coord.url()).with_token("client-secret");
    let create = protocol::messages::CreateGroupRequest {
        shard_count: Some(2),
        timings: None,
    };
    let group_path = "/v1/streams/orders/groups/billing";

    let unauthorized = |resp| error_json(resp, StatusCode::UNAUTHORIZED, Status::Unauthorized);
    // A valid token without the role: known caller, not allowed.
    let forbidden = |resp| error_json(resp, StatusCode::FORBIDDEN, Status::Unauthorized);
    unauthorized(anonymous.post(group_path, &create).await).await;
    forbidden(client.post(group_path, &create).await).await;
    admin.create_group(S, G, 2).await;
    unauthorized(anonymous.get(group_path).await).await;
    forbidden(client.get("/v1/groups").await).await;
    forbidden(client.get("/v1/streams/orders").await).await;
    ok_json::<GroupList>(admin.get("/v1/groups").await, StatusCode::OK).await;

    unauthorized(anonymous.post(HB, &join("a")).await).await;
    forbidden(admin.post(HB, &join("a")).await).await;
    unauthorized(
        Api::new(coord.url())
            .with_token("client-secreT")
            .post(HB, &join("a"))
            .await,
    )
    .await;
    // Auth is checked before the body: a refused caller learns nothing about the request's validity.
    unauthorized(anonymous.post(HB, &serde_json::json!({"nonsense": true})).await).await;
    client.hb(S, G, &join("a")).await;
    unauthorized(anonymous.get("/v1/streams/orders/routing").await).await;
    ok_json::<RoutingResponse>(client.get("/v1/streams/orders/routing").await, StatusCode::OK).await;

    assert_eq!(anonymous.get("/healthz").await.status(), StatusCode::OK);
    assert_eq!(anonymous.get("/readyz").await.status(), StatusCode::OK);
    coord.shutdown().await;
}

#[tokio::test]
async fn list_groups_rebuilds_a_lost_index() {
    let redis = RedisServer::start().await;
    // No tick: the tick loop also rebuilds the index, and would race the "lost" assertion below.
    let mut quiet = config(&redis.url());
    quiet.tick_interval = Duration::from_secs(3600);
    let coord = CoordinatorHandle::spawn(quiet).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    api.create_group(S, "audit", 2).await;
    let mut con = redis.connection().await;
    let _: () = redis::cmd("DEL")
        .arg(protocol::keys::groups_index())
        .query_async(&mut con)
        .await
        .unwrap();
    let lost: GroupList = ok_json(api.get("/v1/groups?rebuild=false").await, StatusCode::OK).await;
    assert!(lost.groups.is_empty());
    let rebuilt: GroupList = ok_json(api.get("/v1/groups?rebuild=true").await, StatusCode::OK).await;
    let names: Vec<&str> = rebuilt.groups.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(names, ["audit", "billing"]);
    coord.shutdown().await;
}
