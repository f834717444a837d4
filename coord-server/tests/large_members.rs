//! A member of the largest group a stream allows (65,536 shards, `protocol::metadata::MAX_SHARDS`) can heartbeat:
//! its requests list every shard it owns or drains, which passes the general 256 KiB body limit from ~43k owned
//! shards (~9k draining) on (issue 33). The heartbeat route takes up to the bound the protocol computes for the
//! largest valid request, and nothing more.

mod common;

use common::{follow_up, patient_timings, Api};
use coord_server::server::CoordinatorHandle;
use protocol::messages::{HeartbeatRequest, RevokeState, RevokingShard};
use protocol::metadata::MAX_SHARDS;
use protocol::{ShardId, Status};
use reqwest::StatusCode;
use std::time::Duration;
use test_support::RedisServer;

const S: &str = "huge";
const G: &str = "readers";

fn heartbeat_path() -> String {
    format!("{}/heartbeat", protocol::routes::group(S, G))
}

/// The body `req` is sent as, for the size checks.
fn size(req: &HeartbeatRequest) -> usize {
    serde_json::to_vec(req).expect("serialises").len()
}

#[tokio::test]
async fn a_member_of_a_65536_shard_group_heartbeats_owning_or_draining_every_shard() {
    // Patient deadlines and timings: a debug build on a busy machine takes seconds over 65,536 shards, and the
    // member must not expire meanwhile.
    let redis = RedisServer::start().await;
    let mut config = common::config(&redis.url());
    config.mutex_ttl = Duration::from_secs(10);
    config.critical_section_timeout = Duration::from_secs(8);
    config.request_timeout = Duration::from_secs(60);
    config.tick_interval = Duration::from_secs(3600);
    config.default_timings = patient_timings();
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group_with(S, G, MAX_SHARDS, patient_timings()).await;
    let joined = api.hb(S, G, &common::join("a")).await;
    assert_eq!(
        joined.assigned.len(),
        MAX_SHARDS as usize,
        "the only member gets every shard"
    );

    // Reading every shard.
    let owning_all = follow_up(&joined, &joined.assigned);
    assert!(
        size(&owning_all) > 256 * 1024,
        "past the general limit: {}",
        size(&owning_all)
    );
    let resp = api.post(&heartbeat_path(), &owning_all).await;
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "{}",
        resp.text().await.unwrap_or_default()
    );

    // The largest request a consumer sends: every shard still draining (the longest entry per shard).
    let mut draining_all = owning_all.clone();
    draining_all.revoking = draining_all
        .owned
        .drain(..)
        .map(|shard| RevokingShard {
            shard,
            state: RevokeState::Draining,
        })
        .collect();
    let resp = api.post(&heartbeat_path(), &draining_all).await;
    assert_ne!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "{}", size(&draining_all));
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap_or_default());

    // Beyond any valid request (every shard twice over, in both lists): still refused before it is buffered.
    let mut oversized = draining_all.clone();
    oversized.revoking.extend(draining_all.revoking.iter().copied());
    oversized.owned = (0..MAX_SHARDS).map(ShardId).collect();
    let body = common::error_json(
        api.post(&heartbeat_path(), &oversized).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        Status::InvalidRequest,
    )
    .await;
    assert!(
        body.message.contains("bytes") || body.message.contains("large"),
        "{body:?}"
    );
    coord.shutdown().await;
}
