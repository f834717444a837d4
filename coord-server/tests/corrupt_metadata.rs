//! A stored field this build cannot parse, or whose version it does not understand, fails closed: every request
//! and tick of the group answers `METADATA_UNAVAILABLE`, nothing in Redis changes (not even a field the next
//! write would have "fixed"), and the group's mutex is not left behind. The decode cache saves parsing, never
//! these checks.

mod common;

use common::*;
use coord_server::store::{group_fields, FieldWrite, LivenessScope, SectionKeys, Store, Write};
use coord_server::Error;
use protocol::keys;
use protocol::messages::{AddShardsRequest, HeartbeatResponse};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::Status;
use redis::aio::MultiplexedConnection;
use reqwest::StatusCode;
use std::collections::BTreeMap;
use std::time::Duration;
use test_support::wait_for;

const S: &str = "orders";
const G: &str = "billing";
const DESCRIBE: &str = "/v1/streams/orders/groups/billing";

/// Every hash of the group and its stream, field by field.
type Stored = BTreeMap<String, BTreeMap<String, String>>;

async fn stored(conn: &mut MultiplexedConnection) -> Stored {
    let stream = StreamName::new(S).unwrap();
    let mut all = Stored::new();
    for key in [metadata_key(S, G), liveness_key(S, G), keys::stream_routing(&stream)] {
        let fields: BTreeMap<String, String> = redis::cmd("HGETALL").arg(&key).query_async(conn).await.unwrap();
        all.insert(key, fields);
    }
    all
}

async fn hset(conn: &mut MultiplexedConnection, key: &str, field: &str, value: &str) {
    let _: i64 = redis::cmd("HSET")
        .arg(key)
        .arg(field)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

/// Whether a mutex is held: a released one is left empty (or has expired: missing).
async fn held(conn: &mut MultiplexedConnection, key: &str) -> bool {
    let holder: Option<String> = redis::cmd("GET").arg(key).query_async(conn).await.unwrap();
    holder.is_some_and(|h| !h.is_empty())
}

struct Fixture {
    redis: test_support::RedisServer,
    coord: coord_server::server::CoordinatorHandle,
    api: Api,
    conn: MultiplexedConnection,
    /// Member `a`'s last answer (it reads what it was assigned).
    a: HeartbeatResponse,
}

/// A group with one member, `a`, whose aggregate is in the coordinator's decode cache.
async fn group_with_a() -> Fixture {
    let (redis, coord) = start().await;
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let joined = api.hb(S, G, &join("a")).await;
    let a = api.hb(S, G, &follow_up(&joined, &joined.assigned)).await;
    let conn = redis.connection().await;
    Fixture {
        redis,
        coord,
        api,
        conn,
        a,
    }
}

impl Fixture {
    async fn refused(&self, req: &protocol::messages::HeartbeatRequest) {
        let (http, body) = self.api.heartbeat(S, G, req).await.expect_err("refused");
        assert_eq!(
            (http, body.status),
            (StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable),
            "{body:?}"
        );
    }

    /// A heartbeat of `a`, a join of `b`, a tick and a describe all fail closed; nothing changes in Redis and the
    /// mutex is free.
    async fn fails_closed(mut self) {
        let before = stored(&mut self.conn).await;
        self.refused(&follow_up(&self.a, &self.a.assigned)).await;
        self.refused(&join("b")).await;
        let tick = self
            .coord
            .coordinator()
            .tick_group(&S.parse().unwrap(), &G.parse().unwrap())
            .await
            .expect_err("the tick fails closed");
        assert!(matches!(tick, Error::MetadataUnavailable(_)), "{tick:?}");
        error_json(
            self.api.get(DESCRIBE).await,
            StatusCode::SERVICE_UNAVAILABLE,
            Status::MetadataUnavailable,
        )
        .await;
        assert_eq!(stored(&mut self.conn).await, before, "nothing was written");
        assert!(
            !held(&mut self.conn, &mutex_key(S, G)).await,
            "the mutex is not left held"
        );
        self.coord.shutdown().await;
    }
}

async fn corrupt_metadata_field_fails_closed(field: &str, value: &str) {
    let mut f = group_with_a().await;
    hset(&mut f.conn, &metadata_key(S, G), field, value).await;
    f.fails_closed().await;
}

#[tokio::test]
async fn a_non_numeric_revision_fails_closed() {
    corrupt_metadata_field_fails_closed("revision", "12x").await;
}

#[tokio::test]
async fn a_revision_with_a_leading_zero_fails_closed() {
    corrupt_metadata_field_fails_closed("revision", "07").await;
}

#[tokio::test]
async fn a_non_numeric_liveness_revision_fails_closed() {
    corrupt_metadata_field_fails_closed("livenessRevision", "many").await;
}

#[tokio::test]
async fn a_non_numeric_schema_version_fails_closed() {
    corrupt_metadata_field_fails_closed("schemaVersion", "one").await;
}

#[tokio::test]
async fn a_schema_version_above_u32_is_not_truncated_to_a_known_one() {
    // 2^32 + 1: read as 1 by a truncating parse.
    corrupt_metadata_field_fails_closed("schemaVersion", "4294967297").await;
}

#[tokio::test]
async fn a_non_numeric_layout_version_fails_closed() {
    corrupt_metadata_field_fails_closed("layoutVersion", "x").await;
}

#[tokio::test]
async fn a_malformed_run_id_fails_closed() {
    corrupt_metadata_field_fails_closed("runId", "not-a-run-id").await;
}

#[tokio::test]
async fn a_non_numeric_updated_at_fails_closed() {
    corrupt_metadata_field_fails_closed("updatedAt", "later").await;
}

/// One member's unreadable lease fails closed for that member only (docs/failure-handling.md, "One member's
/// unreadable lease"): its heartbeats are refused and its lease counts as never ending (its shards are never given
/// away on data nobody can read), while describe, the tick's expiry of the other members and joins all go on.
#[tokio::test]
async fn a_non_numeric_lease_fails_closed_for_its_member_only() {
    let mut f = group_with_a().await;
    hset(&mut f.conn, &liveness_key(S, G), "a", "forever").await;
    f.refused(&follow_up(&f.a, &f.a.assigned)).await;

    let described: protocol::messages::GroupDescription = ok_json(f.api.get(DESCRIBE).await, StatusCode::OK).await;
    let a = described
        .members
        .iter()
        .find(|m| m.member_id.as_str() == "a")
        .expect("a is described");
    assert_eq!(
        a.lease_until_ms,
        protocol::MetadataVersion::MAX_SAFE.0,
        "shown as never ending: {a:?}"
    );

    // b joins (and commits); then b stops heartbeating and the tick expires it, while a, whose lease nobody can
    // read, is never expired and keeps its shards.
    let b = f.api.hb(S, G, &join("b")).await;
    assert_eq!(b.status, Status::Ok, "{b:?}");
    let owners = |d: &protocol::messages::GroupDescription| -> Vec<Option<String>> {
        d.shards
            .iter()
            .map(|s| s.owner.as_ref().map(|o| o.to_string()))
            .collect()
    };
    let (api, member_ttl) = (&f.api, Duration::from_millis(timings().member_ttl_ms));
    let after = wait_for(member_ttl * 5, "b to expire", || async move {
        let d: protocol::messages::GroupDescription = ok_json(api.get(DESCRIBE).await, StatusCode::OK).await;
        (d.members.len() == 1).then_some(d)
    })
    .await;
    assert_eq!(after.members[0].member_id.as_str(), "a", "{after:?}");
    assert_eq!(
        owners(&after),
        vec![Some("a".to_owned()); 2],
        "a's shards stay with a: {after:?}"
    );
    f.coord
        .coordinator()
        .tick_group(&S.parse().unwrap(), &G.parse().unwrap())
        .await
        .expect("the tick goes on");
    let lease: String = redis::cmd("HGET")
        .arg(liveness_key(S, G))
        .arg("a")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(lease, "forever", "the unreadable field is never overwritten");
    f.coord.shutdown().await;
}

#[tokio::test]
async fn a_non_numeric_lease_of_a_joining_member_is_refused_before_the_aggregate_is_written() {
    // The join writes the aggregate and renews b: the renewal must not meet b's corrupt entry after the aggregate
    // write (Redis keeps what a failing script wrote before it failed).
    let mut f = group_with_a().await;
    hset(&mut f.conn, &liveness_key(S, G), "b", "forever").await;
    let before = stored(&mut f.conn).await;
    f.refused(&join("b")).await;
    assert_eq!(stored(&mut f.conn).await, before, "nothing was written");
    assert!(!held(&mut f.conn, &mutex_key(S, G)).await, "the mutex is not left held");
    // Members the corrupt entry does not concern keep working: a's heartbeats load only a's lease.
    let r = f.api.hb(S, G, &follow_up(&f.a, &f.a.assigned)).await;
    assert_eq!(r.status, Status::Ok);
    f.coord.shutdown().await;
}

#[tokio::test]
async fn commit_checks_what_it_overwrites_before_writing_anything() {
    // A foreign writer damages the hash between a section's load and its commit: the commit must refuse whole.
    let mut f = group_with_a().await;
    let store = Store::new(f.redis.connection_manager().await);
    let keys = SectionKeys::group(&S.parse().unwrap(), &G.parse().unwrap());
    let token = store.token();
    let a = MemberId::new("a").unwrap();
    for (key, field, value) in [
        (liveness_key(S, G), "a", "forever"),
        (metadata_key(S, G), "schemaVersion", "99"),
        (metadata_key(S, G), "revision", "x"),
    ] {
        // The coordinator's tick loop takes the mutex for a moment every 50 ms.
        let loaded = wait_for(Duration::from_secs(5), "the mutex", || {
            let (store, keys, token, a) = (&store, &keys, &token, &a);
            async move {
                store
                    .try_load(keys, token, Duration::from_secs(5), None, LivenessScope::Member(a))
                    .await
                    .unwrap()
            }
        })
        .await;
        let original: String = redis::cmd("HGET")
            .arg(&key)
            .arg(field)
            .query_async(&mut f.conn)
            .await
            .unwrap();
        hset(&mut f.conn, &key, field, value).await;
        let before = stored(&mut f.conn).await;
        let renew = [(a.clone(), loaded.now_ms + 60_000)];
        let fields = FieldWrite {
            changes: vec![("m:z".into(), Some("{\"replaced\":true}".into()), String::new())],
            converts: String::new(),
        };
        let write = Write {
            fields: Some(&fields),
            renew: &renew,
            now_ms: loaded.now_ms,
            run_id: &loaded.run_id,
            ..Write::default()
        };
        let err = store
            .commit(&keys, &token, loaded.revision, loaded.liveness_revision, &write)
            .await
            .expect_err("refused");
        assert!(matches!(err, coord_server::StoreError::Corrupt(_)), "{field}: {err:?}");
        assert_eq!(stored(&mut f.conn).await, before, "{field}: nothing was written");
        assert!(
            !held(&mut f.conn, &mutex_key(S, G)).await,
            "{field}: the mutex was released"
        );
        hset(&mut f.conn, &key, field, &original).await;
    }
    f.coord.shutdown().await;
}

#[tokio::test]
async fn an_unknown_schema_version_under_a_warm_cache_fails_closed_and_is_not_rewritten() {
    let mut f = group_with_a().await;
    // The revision does not change: the coordinator's cached aggregate is still "current".
    hset(&mut f.conn, &metadata_key(S, G), "schemaVersion", "99").await;
    f.fails_closed().await;
}

#[tokio::test]
async fn an_unknown_layout_version_under_a_warm_cache_fails_closed() {
    let mut f = group_with_a().await;
    hset(&mut f.conn, &metadata_key(S, G), "layoutVersion", "3").await;
    f.fails_closed().await;
}

#[tokio::test]
async fn a_garbage_member_field_under_a_warm_cache_is_not_served_nor_replaced() {
    let mut f = group_with_a().await;
    hset(&mut f.conn, &metadata_key(S, G), "m:a", "garbage").await;
    f.fails_closed().await;
}

#[tokio::test]
async fn an_edit_that_keeps_the_field_length_is_never_overwritten_and_fails_closed_from_the_next_tick() {
    let mut f = group_with_a().await;
    let key = metadata_key(S, G);
    let original: String = redis::cmd("HGET")
        .arg(&key)
        .arg("group")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    hset(&mut f.conn, &key, "group", &" ".repeat(original.len())).await;
    let before = stored(&mut f.conn).await;
    // b's join is decided on the cached fields (the lengths match), but its write of the group field is refused:
    // the stored one is not the one the decision read.
    f.refused(&join("b")).await;
    assert_eq!(stored(&mut f.conn).await, before, "nothing was written");
    // A tick compares digests; from then on nothing is served from the cache either.
    let tick = f
        .coord
        .coordinator()
        .tick_group(&S.parse().unwrap(), &G.parse().unwrap())
        .await
        .expect_err("the tick fails closed");
    assert!(matches!(tick, Error::MetadataUnavailable(_)), "{tick:?}");
    f.fails_closed().await;
}

#[tokio::test]
async fn a_deleted_group_field_under_a_warm_cache_fails_closed() {
    let mut f = group_with_a().await;
    let _: i64 = redis::cmd("HDEL")
        .arg(metadata_key(S, G))
        .arg("group")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    f.fails_closed().await;
}

#[tokio::test]
async fn a_repaired_hash_is_served_again() {
    let mut f = group_with_a().await;
    let key = metadata_key(S, G);
    let original: String = redis::cmd("HGET")
        .arg(&key)
        .arg("m:a")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    hset(&mut f.conn, &key, "m:a", "garbage").await;
    f.refused(&follow_up(&f.a, &f.a.assigned)).await;
    hset(&mut f.conn, &key, "m:a", &original).await;
    let r = f.api.hb(S, G, &follow_up(&f.a, &f.a.assigned)).await;
    assert_eq!((r.status, r.assigned.clone()), (Status::Ok, f.a.assigned.clone()));
    f.coord.shutdown().await;
}

#[tokio::test]
async fn a_corrupt_routing_hash_fails_closed_for_reads_and_writes() {
    let stream = StreamName::new(S).unwrap();
    let routing = keys::stream_routing(&stream);
    for (field, value) in [
        ("revision", "x"),
        ("schemaVersion", "99"),
        ("schemaVersion", "4294967297"),
        ("layoutVersion", "x"),
        ("aggregate", "garbage"),
    ] {
        let mut f = group_with_a().await;
        hset(&mut f.conn, &routing, field, value).await;
        let before = stored(&mut f.conn).await;
        for resp in [
            f.api.get("/v1/streams/orders").await,
            f.api
                .post("/v1/streams/orders/shards", &AddShardsRequest { count: 1 })
                .await,
        ] {
            let body = error_json(resp, StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable).await;
            assert!(!body.message.is_empty(), "{field}={value}");
        }
        assert_eq!(
            stored(&mut f.conn).await,
            before,
            "{field}={value}: nothing was written"
        );
        assert!(
            !held(&mut f.conn, &keys::stream_routing_mutex(&stream)).await,
            "{field}={value}: the routing mutex is not left held"
        );
        // The group's own ticks go on (expiry must not stop because the routing is damaged).
        f.coord
            .coordinator()
            .tick_group(&stream, &GroupName::new(G).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{field}={value}: the group still ticks: {e}"));
        f.coord.shutdown().await;
    }
}

/// Two coordinators on one Redis, both holding the group (40 shards: blocks `s:0`, `s:1` and `s:2`, the last
/// one of 8 shards) in their caches at the stored revision, and member `a` owning and reading every shard.
struct TwoWarm {
    _redis: test_support::RedisServer,
    coords: [coord_server::server::CoordinatorHandle; 2],
    apis: [Api; 2],
    conn: MultiplexedConnection,
    a: HeartbeatResponse,
}

async fn stored_revision(conn: &mut MultiplexedConnection) -> String {
    redis::cmd("HGET")
        .arg(metadata_key(S, G))
        .arg("revision")
        .query_async(conn)
        .await
        .unwrap()
}

async fn two_warm_coordinators() -> TwoWarm {
    let redis = test_support::RedisServer::start().await;
    let mut coords = Vec::new();
    for _ in 0..2 {
        let coord = coord_server::server::CoordinatorHandle::spawn(config(&redis.url()))
            .await
            .expect("coordinator starts");
        coords.push(coord);
    }
    let coords: [_; 2] = coords.try_into().unwrap_or_else(|_| unreachable!());
    let apis = [Api::new(coords[0].url()), Api::new(coords[1].url())];
    let mut conn = redis.connection().await;
    apis[0].create_group(S, G, 40).await;
    let joined = apis[0].hb(S, G, &join("a")).await;
    let mut a = apis[0].hb(S, G, &follow_up(&joined, &joined.assigned)).await;
    // Until one heartbeat through each coordinator leaves the revision where it was: each loaded the stored
    // revision and nobody committed since.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before = stored_revision(&mut conn).await;
        for api in &apis {
            a = api.hb(S, G, &follow_up(&a, &a.assigned)).await;
        }
        if a.status == Status::Ok && a.assigned.len() == 40 && stored_revision(&mut conn).await == before {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the group never settled: {a:?}");
    }
    TwoWarm {
        _redis: redis,
        coords,
        apis,
        conn,
        a,
    }
}

impl TwoWarm {
    async fn field(&mut self, name: &str) -> String {
        redis::cmd("HGET")
            .arg(metadata_key(S, G))
            .arg(name)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// The next heartbeat of `a` through each coordinator, and a describe through each, answer 503
    /// `METADATA_UNAVAILABLE`, and nothing in Redis changes.
    async fn both_refuse(&mut self) {
        let before = stored(&mut self.conn).await;
        for (i, api) in self.apis.iter().enumerate() {
            let (http, body) = api
                .heartbeat(S, G, &follow_up(&self.a, &self.a.assigned))
                .await
                .expect_err("the next heartbeat is refused");
            assert_eq!(
                (http, body.status),
                (StatusCode::SERVICE_UNAVAILABLE, Status::MetadataUnavailable),
                "coordinator {i}: {body:?}"
            );
            error_json(
                api.get(DESCRIBE).await,
                StatusCode::SERVICE_UNAVAILABLE,
                Status::MetadataUnavailable,
            )
            .await;
        }
        assert_eq!(stored(&mut self.conn).await, before, "nothing was written");
    }

    /// After the repair, `a`'s heartbeats through each coordinator are served again, with what it owned.
    async fn both_serve(&mut self) {
        for api in &self.apis {
            let r = api.hb(S, G, &follow_up(&self.a, &self.a.assigned)).await;
            assert_eq!((r.status, &r.assigned), (Status::Ok, &self.a.assigned), "{r:?}");
        }
    }

    async fn shutdown(self) {
        for coord in self.coords {
            coord.shutdown().await;
        }
    }
}

/// A stored field with its stamp kept and its JSON made unreadable and one byte longer (`x` appended) or shorter
/// (the closing `]` dropped).
fn damaged(original: &str, grow: bool) -> String {
    if grow {
        format!("{original}x")
    } else {
        original[..original.len() - 1].to_owned()
    }
}

/// docs/failure-handling.md, "a field changed at the same revision": a shard block edited outside a commit (its
/// stamp kept, its JSON unreadable, its length changed) is refused by the very next load of each coordinator
/// that has the group cached, never overwritten, and served again once repaired.
async fn an_edited_block_fails_closed_on_the_next_heartbeat_of_each_coordinator(block: &str) {
    let mut w = two_warm_coordinators().await;
    let original = w.field(block).await;
    let (stamp, _) = original.split_once(':').expect("a stamped field");
    let edit = damaged(&original, false);
    assert!(edit.starts_with(&format!("{stamp}:")), "the stamp is kept");
    hset(&mut w.conn, &metadata_key(S, G), block, &edit).await;
    w.both_refuse().await;
    assert_eq!(w.field(block).await, edit, "the damaged field is not overwritten");
    hset(&mut w.conn, &metadata_key(S, G), block, &original).await;
    w.both_serve().await;
    w.shutdown().await;
}

#[tokio::test]
async fn an_edited_first_shard_block_under_two_warm_caches_fails_closed_on_the_next_heartbeat() {
    an_edited_block_fails_closed_on_the_next_heartbeat_of_each_coordinator("s:0").await;
}

#[tokio::test]
async fn an_edited_middle_shard_block_under_two_warm_caches_fails_closed_on_the_next_heartbeat() {
    an_edited_block_fails_closed_on_the_next_heartbeat_of_each_coordinator("s:1").await;
}

#[tokio::test]
async fn an_edited_last_shard_block_under_two_warm_caches_fails_closed_on_the_next_heartbeat() {
    an_edited_block_fails_closed_on_the_next_heartbeat_of_each_coordinator("s:2").await;
}

#[tokio::test]
async fn two_block_edits_that_keep_the_sum_of_the_lengths_fail_closed_on_the_next_heartbeat() {
    // One block a byte longer, another a byte shorter: the count of fields and the total length are the same.
    let mut w = two_warm_coordinators().await;
    let (first, last) = (w.field("s:0").await, w.field("s:2").await);
    hset(&mut w.conn, &metadata_key(S, G), "s:0", &damaged(&first, true)).await;
    hset(&mut w.conn, &metadata_key(S, G), "s:2", &damaged(&last, false)).await;
    w.both_refuse().await;
    hset(&mut w.conn, &metadata_key(S, G), "s:0", &first).await;
    hset(&mut w.conn, &metadata_key(S, G), "s:2", &last).await;
    w.both_serve().await;
    w.shutdown().await;
}

#[tokio::test]
async fn an_edited_shard_block_a_delta_does_not_send_fails_closed_on_that_load() {
    // Under the mutex, as another coordinator's section would: `s:1` is damaged, then a commit rewrites `group`
    // alone (the same document, newly stamped). Each coordinator's next load is the change since its cached
    // revision, which names `group` only: `s:1` would come from its cache.
    let mut w = two_warm_coordinators().await;
    let store = Store::new(w._redis.connection_manager().await);
    let keys = SectionKeys::group(&S.parse().unwrap(), &G.parse().unwrap());
    let token = store.token();
    let loaded = wait_for(Duration::from_secs(5), "the mutex", || {
        let (store, keys, token) = (&store, &keys, &token);
        async move {
            store
                .try_load(keys, token, Duration::from_secs(5), None, LivenessScope::None)
                .await
                .unwrap()
        }
    })
    .await;
    let block = w.field("s:1").await;
    hset(&mut w.conn, &metadata_key(S, G), "s:1", &damaged(&block, false)).await;
    let head = w.field("group").await;
    let (_, json) = head.split_once(':').expect("a stamped field");
    let digest = group_fields::digest_hex(group_fields::field_digest("group", head.as_bytes()));
    let fields = FieldWrite {
        changes: vec![("group".into(), Some(json.to_owned()), digest)],
        converts: String::new(),
    };
    let write = Write {
        fields: Some(&fields),
        now_ms: loaded.now_ms,
        run_id: &loaded.run_id,
        ..Write::default()
    };
    let committed = store
        .commit(&keys, &token, loaded.revision, loaded.liveness_revision, &write)
        .await
        .expect("committed");
    assert!(
        matches!(committed, coord_server::store::Committed::Ok(_)),
        "{committed:?}"
    );
    w.both_refuse().await;
    hset(&mut w.conn, &metadata_key(S, G), "s:1", &block).await;
    w.both_serve().await;
    w.shutdown().await;
}
