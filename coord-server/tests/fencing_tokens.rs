//! Fencing tokens through the running coordinator: answers carry them, a coordinator restart keeps them, and a
//! group recreated after its metadata was lost hands out tokens above the lost group's.

mod common;

use common::*;
use coord_server::server::CoordinatorHandle;
use protocol::messages::{HeartbeatResponse, RecreateGroupRequest};
use protocol::{FencingToken, ShardId, Status};
use reqwest::StatusCode;
use std::time::Duration;
use test_support::wait_for;

const S: &str = "orders";
const G: &str = "billing";

fn token(r: &HeartbeatResponse, shard: u32) -> FencingToken {
    r.fencing_tokens
        .iter()
        .find(|t| t.shard == ShardId(shard))
        .map(|t| t.token)
        .unwrap_or_else(|| panic!("no token for shard {shard}: {r:?}"))
}

#[tokio::test]
async fn tokens_survive_a_coordinator_restart_and_grow_across_a_recreate() {
    let (redis, first) = start().await;
    let api = Api::new(first.url());
    api.create_group(S, G, 2).await;
    let a1 = api.hb(S, G, &join("a")).await;
    let before = token(&a1, 0);
    assert!(
        before > FencingToken(1_600_000_000_000),
        "minted from Redis time: {before}"
    );
    let described = api.describe(S, G).await;
    assert_eq!(described.shards[0].fencing_token, before, "recorded and described");

    // Another coordinator process: the tokens are in Redis.
    first.abort();
    let second = CoordinatorHandle::spawn(config(&redis.url())).await.unwrap();
    let api = Api::new(second.url());
    let a2 = api.hb(S, G, &follow_up(&a1, &a1.assigned)).await;
    assert_eq!(token(&a2, 0), before, "same owner, same token after a restart");

    // The metadata is lost and the group recreated: the new group's tokens are above the lost ones.
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("DEL")
        .arg(metadata_key(S, G))
        .query_async(&mut conn)
        .await
        .unwrap();
    let recreate = RecreateGroupRequest {
        confirm: true,
        shard_count: 2,
        timings: Some(timings()),
    };
    let resp = api.post(&protocol::routes::recreate(S, G), &recreate).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let mut rejoin = join("a");
    rejoin.max_observed_version = a2.metadata_version;
    let joined = api.hb(S, G, &rejoin).await;
    // Heartbeat as a client would until the recreated group's correction round lets it read again.
    let ok = wait_for(Duration::from_secs(10), "an OK answer after the recreate", || {
        let (api, req) = (api.clone(), follow_up(&joined, &[]));
        async move {
            let mut req = req;
            req.max_observed_version = req.max_observed_version.max(a2.metadata_version);
            let r = api.hb(S, G, &req).await;
            (r.status == Status::Ok).then_some(r)
        }
    })
    .await;
    for s in [0, 1] {
        assert!(token(&ok, s) > token(&a2, s), "shard {s}: {ok:?}");
    }
    second.shutdown().await;
}
