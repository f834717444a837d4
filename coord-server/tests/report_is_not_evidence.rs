//! Redis is the evidence, never a client's word (issue "Redis is the evidence"): a routing fetch or a heartbeat
//! reporting a higher routing version or shard count than Redis stores makes the coordinator look at Redis, and
//! only what Redis holds (shard records, fences, shard keys beyond the routing that hold entries) restores a
//! growth, within the stream's growth ceiling. Against a real `redis-server`, restarted to give it a new run id
//! (what a coordinator sees after any restart, failover or restore).

mod common;

use common::*;
use coord_server::server::CoordinatorHandle;
use coord_server::stats::Stats;
use protocol::messages::RoutingResponse;
use protocol::names::StreamName;
use protocol::{keys, RoutingVersion, ShardId, Status};
use redis::AsyncCommands;
use reqwest::StatusCode;
use std::collections::BTreeMap;
use std::time::Duration;
use test_support::{wait_for, RedisServer};

const S: &str = "orders";
const G: &str = "billing";
const WAIT: Duration = Duration::from_secs(10);

fn stream() -> StreamName {
    StreamName::new(S).unwrap()
}

/// The routing hash's fields and the number of shard keys (records and streams): what a believed report writes.
async fn footprint(redis: &RedisServer) -> (BTreeMap<String, String>, usize) {
    let mut con = redis.connection().await;
    let routing: BTreeMap<String, String> = con.hgetall(keys::stream_routing(&stream())).await.unwrap();
    let shard_keys: Vec<String> = redis::cmd("KEYS")
        .arg("redis-stream:shard*")
        .query_async(&mut con)
        .await
        .unwrap();
    (routing, shard_keys.len())
}

/// A routing fetch answered 200 (after a restart the first ones may find Redis loading).
async fn fetch(api: &Api, path: &str) -> RoutingResponse {
    wait_for(WAIT, "a routing fetch answered 200", || async {
        let r = api.get(path).await;
        if r.status() != StatusCode::OK {
            return None;
        }
        r.json::<RoutingResponse>().await.ok()
    })
    .await
}

fn forged(v: u64, shards: u32) -> String {
    format!("/v1/streams/{S}/routing?routingVersion=1&maxObservedVersion={v}&maxShardCount={shards}")
}

/// The reproduction: one forged fetch after a clean restart grew a stream from 8 to 65,536 shards. Now,
/// with and without a restart, a forged report (routing fetch or heartbeat) changes nothing and is answered with
/// the stored routing.
#[tokio::test]
async fn a_forged_report_changes_nothing_with_or_without_a_restart() {
    let (mut redis, coord) = start_persistent().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 8).await;
    let plain = fetch(&api, &format!("/v1/streams/{S}/routing")).await;
    let v = plain.routing_version.0;
    let before = footprint(&redis).await;

    for restarted in [false, true] {
        if restarted {
            redis.restart().await;
        }
        for (version, shards) in [(2, 65_536), (v + 5, 9), (v, 16)] {
            let answer = fetch(&api, &forged(version, shards)).await;
            assert_eq!(answer.status, Status::SyncMetadata, "restarted: {restarted}");
            assert_eq!(
                (answer.routing_version.0, answer.shard_count),
                (v, 8),
                "the stored routing is answered (restarted: {restarted})"
            );
        }
        // A consumer's heartbeat reporting the same: checked in the background, it must change nothing either.
        let mut hb = join(&format!("m-{restarted}"));
        hb.max_routing_version = RoutingVersion(v + 7);
        hb.max_shard_count = 65_536;
        let stats = coord.coordinator().stats();
        let checks = Stats::get(&stats.routing_report_checks);
        let answered = api.heartbeat(S, G, &hb).await;
        assert!(answered.is_ok(), "{answered:?}");
        // The check runs in the background after the answer: wait for it to finish, then look.
        test_support::wait_until(WAIT, "the heartbeat's report is checked", || async {
            Stats::get(&stats.routing_report_checks) > checks
        })
        .await;
        let after = fetch(&api, &format!("/v1/streams/{S}/routing")).await;
        assert_eq!(
            (after.routing_version.0, after.shard_count),
            (v, 8),
            "restarted: {restarted}"
        );
        assert_eq!(
            footprint(&redis).await,
            before,
            "nothing written (restarted: {restarted})"
        );
    }
    // Out of bounds: refused as invalid; an unknown stream is not found.
    let bad = api.get(&forged(1, 65_537)).await;
    error_json(bad, StatusCode::BAD_REQUEST, Status::InvalidRequest).await;
    let unknown = api.get("/v1/streams/nowhere/routing").await;
    error_json(unknown, StatusCode::NOT_FOUND, Status::NotFound).await;
    coord.shutdown().await;
}

/// What producers of a layout Redis lost wrote is the evidence: shard keys beyond the stored count that hold
/// entries restore a growth to them (under a version above every one the lost history issued); a report beyond
/// that still changes nothing.
#[tokio::test]
async fn shard_keys_beyond_the_routing_that_hold_entries_restore_a_growth_to_them() {
    let (mut redis, coord) = start_persistent().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 3).await;
    let v = fetch(&api, &format!("/v1/streams/{S}/routing")).await.routing_version.0;
    redis.restart().await;
    // A plain producer of the lost 5-shard layout wrote into shards 3 and 4 (it checks no record).
    let mut con = redis.connection().await;
    for s in [3, 4] {
        let _: String = con
            .xadd(keys::shard_stream(&stream(), ShardId(s)), "*", &[("f", "v")])
            .await
            .unwrap();
    }
    let restored = fetch(&api, &forged(v + 1, 5)).await;
    assert_eq!(restored.shard_count, 5, "{restored:?}");
    assert_eq!(restored.status, Status::Ok);
    assert!(
        restored.routing_version.0 > v + 1,
        "a number the lost history issued is never reused"
    );
    assert!(
        Stats::get(&coord.coordinator().stats().routing_regressions) <= 1,
        "the restoring fetch is no regression of its own"
    );
    // Forged beyond the evidence: answered with the stored routing, nothing grows.
    let ahead = fetch(&api, &forged(restored.routing_version.0 + 5, 64)).await;
    assert_eq!(ahead.status, Status::SyncMetadata);
    assert_eq!(
        (ahead.routing_version, ahead.shard_count),
        (restored.routing_version, 5)
    );
    coord.shutdown().await;
}

/// Evidence of more shards than any token may grow the stream to (stray keys, a foreign writer) is refused: the
/// restoration fails closed, writes nothing and counts the refusal.
#[tokio::test]
async fn a_restoration_above_the_growth_ceiling_fails_closed_and_writes_nothing() {
    let redis = RedisServer::start().await;
    let mut config = config(&redis.url());
    // An open coordinator: add-shards runs under the default quota, whose shard limit is the ceiling.
    config.quota.shards_per_group = 8;
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group(S, G, 4).await;
    let mut con = redis.connection().await;
    for s in 4..12 {
        let _: String = con
            .xadd(keys::shard_stream(&stream(), ShardId(s)), "*", &[("f", "v")])
            .await
            .unwrap();
    }
    let before = footprint(&redis).await;
    let refused = api.get(&forged(50, 12)).await;
    error_json(refused, StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable).await;
    assert_eq!(footprint(&redis).await, before, "nothing written");
    let metrics = coord.coordinator().render_metrics().await;
    assert!(
        metrics.contains("redis_stream_coord_routing_restore_refused_total 1"),
        "{metrics}"
    );
    // Within the ceiling the same evidence restores: keys 4..8 only.
    let _: u64 = con
        .del(
            (8..12)
                .map(|s| keys::shard_stream(&stream(), ShardId(s)))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    let restored = fetch(&api, &forged(50, 12)).await;
    assert_eq!(restored.shard_count, 8);
    coord.shutdown().await;
}
