//! Partial losses of what Redis records: the groups index, the liveness hash, the aggregate field. Each must fail
//! safe (no mass expiry, no silent rebuild, no stopped tick loop).

mod common;

use common::*;
use coord_server::server::CoordinatorHandle;
use protocol::keys;
use protocol::Status;
use reqwest::StatusCode;
use std::time::Duration;
use test_support::wait_until;

const S: &str = "orders";
const G: &str = "billing";

#[tokio::test]
async fn a_lost_groups_index_does_not_stop_expiry() {
    let (redis, first) = start().await;
    let api = Api::new(first.url());
    api.create_group(S, G, 4).await;
    api.hb(S, G, &join("a")).await;
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("DEL")
        .arg(keys::groups_index())
        .query_async(&mut conn)
        .await
        .unwrap();
    first.abort();
    // A coordinator that never served the group and finds no index: it must find the group by SCAN.
    let second = CoordinatorHandle::spawn(config(&redis.url())).await.unwrap();
    let api = Api::new(second.url());
    wait_until(Duration::from_secs(15), "the silent member expires", || {
        let api = api.clone();
        async move { api.describe(S, G).await.members.is_empty() }
    })
    .await;
    let indexed: Vec<String> = redis::cmd("SMEMBERS")
        .arg(keys::groups_index())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(indexed, vec![format!("{S}:{G}")], "the index was rebuilt");
    second.shutdown().await;
}

#[tokio::test]
async fn a_deleted_liveness_hash_gives_grace_instead_of_mass_expiry() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let joined = api.hb(S, G, &join("a")).await;
    // Keep `a` alive past its join-time lease through renewals only (the aggregate keeps the join-time lease).
    let mut last = joined.clone();
    let until = tokio::time::Instant::now() + Duration::from_millis(2_300);
    while tokio::time::Instant::now() < until {
        last = api.hb(S, G, &follow_up(&last, &last.assigned)).await;
        // Real time: the join-time lease must run out on the coordinator's clock (Redis TIME) meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("DEL")
        .arg(liveness_key(S, G))
        .query_async(&mut conn)
        .await
        .unwrap();
    coord
        .coordinator()
        .tick_group(&S.parse().unwrap(), &G.parse().unwrap())
        .await
        .unwrap();
    let d = api.describe(S, G).await;
    assert_eq!(d.members.len(), 1, "a is not expired on the join-time lease alone");
    assert!(
        d.correction.is_some(),
        "a lost liveness hash is a suspected loss: nothing new is handed out"
    );
    let r = api.hb(S, G, &follow_up(&last, &last.assigned)).await;
    assert_eq!(r.status, Status::RevokePending);
    assert_eq!(r.assigned, last.assigned, "a keeps the shards it reads");
    coord.shutdown().await;
}

#[tokio::test]
async fn a_hash_without_its_group_field_fails_closed_and_create_refuses_it() {
    let (redis, first) = start().await;
    let api = Api::new(first.url());
    api.create_group(S, G, 2).await;
    let joined = api.hb(S, G, &join("a")).await;
    first.abort();
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("HDEL")
        .arg(metadata_key(S, G))
        .arg("group")
        .query_async(&mut conn)
        .await
        .unwrap();
    let second = CoordinatorHandle::spawn(config(&redis.url())).await.unwrap();
    let api = Api::new(second.url());
    // The aborted coordinator may have crashed inside a tick of the group (it is due right after the join), its
    // mutex held until the mutex TTL: until then the answer is STORE_UNAVAILABLE (mutex busy), which says nothing
    // about the metadata.
    let err = test_support::poll_for(Duration::from_secs(10), || {
        let api = api.clone();
        let request = follow_up(&joined, &joined.assigned);
        async move {
            let err = api.heartbeat(S, G, &request).await.unwrap_err();
            (err.1.status != Status::StoreUnavailable).then_some(err)
        }
    })
    .await
    .expect("an answer other than a busy mutex");
    assert_eq!(
        (err.0, err.1.status),
        (StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable)
    );
    let resp = api.post(&protocol::routes::group(S, G), &serde_json::json!({})).await;
    error_json(resp, StatusCode::CONFLICT, Status::AlreadyExists).await;
    let exists: bool = redis::cmd("HEXISTS")
        .arg(metadata_key(S, G))
        .arg("group")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "nothing was rebuilt");
    second.shutdown().await;
}
