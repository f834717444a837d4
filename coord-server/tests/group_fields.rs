//! A group's hash in fields (`store::group_fields`), against real Redis: a hash written in the layout before
//! fields (one `aggregate` document) is converted by the coordinator's next section of the group with nothing
//! reassigned; a change writes only the fields it changes; a change cut between two fields fails closed with
//! nothing written; a replica that is behind reads only the changes.

mod common;

use common::*;
use coord_server::store::{self, SectionKeys, Store};
use protocol::metadata::GroupMetadata;
use protocol::names::{GroupName, StreamName};
use protocol::Status;
use redis::aio::MultiplexedConnection;
use reqwest::StatusCode;
use std::collections::BTreeMap;

const S: &str = "orders";
const G: &str = "billing";

fn keys() -> SectionKeys {
    SectionKeys::group(&StreamName::new(S).unwrap(), &GroupName::new(G).unwrap())
}

async fn hash(conn: &mut MultiplexedConnection) -> BTreeMap<String, String> {
    redis::cmd("HGETALL")
        .arg(metadata_key(S, G))
        .query_async(conn)
        .await
        .unwrap()
}

/// The group's metadata as stored, read the way the coordinator reads it.
async fn metadata(store: &Store) -> GroupMetadata {
    let loaded = store.read(&keys(), false).await.unwrap();
    store::decode_group(&loaded, None).unwrap().0
}

/// Rewrites the group's hash as a build before fields left it: the same document in `aggregate`,
/// `schemaVersion` 1, the same revision and run id.
async fn rewrite_in_the_layout_before_fields(conn: &mut MultiplexedConnection, meta: &GroupMetadata) {
    let before = hash(conn).await;
    let _: () = redis::cmd("DEL")
        .arg(metadata_key(S, G))
        .query_async(conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(metadata_key(S, G))
        .arg("aggregate")
        .arg(meta.encode())
        .arg("schemaVersion")
        .arg("1")
        .arg("layoutVersion")
        .arg(&before["layoutVersion"])
        .arg("revision")
        .arg(&before["revision"])
        .arg("runId")
        .arg(&before["runId"])
        .arg("updatedAt")
        .arg(&before["updatedAt"])
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_hash_in_the_layout_before_fields_is_converted_online_with_nothing_reassigned() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 40).await;
    let mut a = api.hb(S, G, &join("a")).await;
    let mut b = api.hb(S, G, &join("b")).await;
    // Settled: both read their half, nothing left to move.
    for _ in 0..10 {
        a = api.hb(S, G, &follow_up(&a, &a.assigned)).await;
        b = api.hb(S, G, &follow_up(&b, &b.assigned)).await;
    }
    assert_eq!((a.assigned.len(), b.assigned.len()), (20, 20), "settled");
    let mut conn = redis.connection().await;
    let store = Store::new(redis.connection_manager().await);
    let old = metadata(&store).await;
    // A coordinator of the build before fields wrote it; this one starts on it with nothing cached.
    coord.shutdown().await;
    rewrite_in_the_layout_before_fields(&mut conn, &old).await;
    assert!(hash(&mut conn).await.contains_key("aggregate"));
    let coord = coord_server::server::CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .unwrap();
    let api = Api::new(coord.url());
    // Describe reads the old layout as it is.
    assert_eq!(api.describe(S, G).await.metadata_version, old.metadata_version);
    // The group's next section (a tick that has nothing else to do) converts it.
    let (stream, group) = (S.parse().unwrap(), G.parse().unwrap());
    coord.coordinator().tick_group(&stream, &group).await.unwrap();
    let stored = hash(&mut conn).await;
    assert!(
        !stored.contains_key("aggregate"),
        "{:?}",
        stored.keys().collect::<Vec<_>>()
    );
    assert_eq!(stored["schemaVersion"], "2");
    assert!(stored.contains_key("group") && stored.contains_key("m:a") && stored.contains_key("m:b"));
    assert_eq!(
        stored.keys().filter(|k| k.starts_with("s:")).count(),
        3,
        "40 shards in blocks of 16"
    );
    assert_eq!(
        metadata(&store).await,
        old,
        "the same metadata, versions and fencing tokens, in fields"
    );
    let a2 = api.hb(S, G, &follow_up(&a, &a.assigned)).await;
    let b2 = api.hb(S, G, &follow_up(&b, &b.assigned)).await;
    assert_eq!((a2.status, b2.status), (Status::Ok, Status::Ok));
    assert_eq!(
        (&a2.assigned, &b2.assigned),
        (&a.assigned, &b.assigned),
        "nothing reassigned"
    );
    assert_eq!(
        (&a2.fencing_tokens, &b2.fencing_tokens),
        (&a.fencing_tokens, &b.fencing_tokens)
    );
    assert_eq!(a2.metadata_version, old.metadata_version, "no version bump");
    coord.shutdown().await;
}

#[tokio::test]
async fn a_change_writes_only_the_fields_it_changes() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 256).await;
    let mut last = Vec::new();
    for i in 0..8 {
        last.push(api.hb(S, G, &join(&format!("m{i}"))).await);
    }
    let mut conn = redis.connection().await;
    let before = hash(&mut conn).await;
    api.hb(S, G, &join("late")).await;
    let after = hash(&mut conn).await;
    let rev: u64 = after["revision"].parse().unwrap();
    let log = &after[&format!("log:{rev}")];
    let changed: Vec<&str> = log.split(' ').collect();
    assert!(changed.contains(&"group") && changed.contains(&"m:late"), "{log}");
    // Every field the log does not name is byte for byte what it was.
    for (name, value) in &before {
        let data = name == "group" || name.starts_with("m:") || name.starts_with("s:");
        if data && !changed.contains(&name.as_str()) {
            assert_eq!(after.get(name), Some(value), "{name} unchanged");
        }
    }
    let written: usize = changed.iter().map(|n| after.get(*n).map_or(0, String::len)).sum();
    let whole: usize = before
        .iter()
        .filter(|(n, _)| !n.starts_with("log:"))
        .map(|(_, v)| v.len())
        .sum();
    assert!(
        changed.len() < before.len() / 2,
        "{} of {} fields",
        changed.len(),
        before.len()
    );
    assert!(written < whole, "{written} of {whole} bytes");
    coord.shutdown().await;
}

#[tokio::test]
async fn a_change_cut_between_two_fields_fails_closed_and_writes_nothing() {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 40).await;
    let a = api.hb(S, G, &join("a")).await;
    let mut conn = redis.connection().await;
    let before_b = hash(&mut conn).await;
    api.hb(S, G, &join("b")).await;
    let after_b = hash(&mut conn).await;
    let rev: u64 = after_b["revision"].parse().unwrap();
    // Cut b's join after its first block: the revision, log and other fields are in, one block is not.
    let block = after_b[&format!("log:{rev}")]
        .split(' ')
        .find(|n| n.starts_with("s:"))
        .expect("b's join moved shards")
        .to_owned();
    let _: () = redis::cmd("HSET")
        .arg(metadata_key(S, G))
        .arg(&block)
        .arg(&before_b[&block])
        .query_async(&mut conn)
        .await
        .unwrap();
    // A coordinator without the group cached (a restart, another replica) reads every field.
    coord.shutdown().await;
    let coord = coord_server::server::CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .unwrap();
    let api = Api::new(coord.url());
    let cut = hash(&mut conn).await;
    let (http, body) = api
        .heartbeat(S, G, &follow_up(&a, &a.assigned))
        .await
        .expect_err("refused");
    assert_eq!(
        (http, body.status),
        (StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable)
    );
    assert!(body.message.contains("cut between fields"), "{}", body.message);
    error_json(
        api.get("/v1/streams/orders/groups/billing").await,
        StatusCode::SERVICE_UNAVAILABLE,
        Status::MetadataUnavailable,
    )
    .await;
    assert_eq!(hash(&mut conn).await, cut, "nothing written over a cut change");
    // Repaired (the block written as the log says), the group is served again.
    let _: () = redis::cmd("HSET")
        .arg(metadata_key(S, G))
        .arg(&block)
        .arg(&after_b[&block])
        .query_async(&mut conn)
        .await
        .unwrap();
    let r = api.hb(S, G, &follow_up(&a, &a.assigned)).await;
    assert_eq!(r.status, Status::Ok);
    coord.shutdown().await;
}

#[tokio::test]
async fn a_replica_behind_reads_only_the_changes_and_agrees_with_the_writer() {
    let (redis, one) = start().await;
    let two = coord_server::server::CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .unwrap();
    let (api1, api2) = (Api::new(one.url()), Api::new(two.url()));
    api1.create_group(S, G, 64).await;
    let a = api1.hb(S, G, &join("a")).await;
    // Two warms its cache, then one writes several changes.
    api2.hb(S, G, &follow_up(&a, &a.assigned)).await;
    for i in 0..5 {
        api1.hb(S, G, &join(&format!("m{i}"))).await;
    }
    let store = Store::new(redis.connection_manager().await);
    let stored = metadata(&store).await;
    let d2 = api2.describe(S, G).await;
    let r = api2
        .heartbeat(S, G, &follow_up(&a, &a.assigned))
        .await
        .expect("two serves a from its delta");
    assert_eq!(r.metadata_version, stored.metadata_version.max(r.metadata_version));
    assert_eq!(d2.members.len(), 6);
    one.shutdown().await;
    two.shutdown().await;
}
