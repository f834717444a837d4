//! Issue 39, item 3: damage to one coordinator key stops nothing else. With the due index, the groups index or a
//! stream's routing hash of the wrong type, holding garbage, or deleted, a member that stops heartbeating in a
//! group whose own keys are intact still loses its shards within the promised bound (its TTL, one sweep period
//! and a few ticks), the damage is counted (`redis_stream_coord_damaged_keys_total`), and the coordinator repairs
//! what it can prove safe to repair (an index of the wrong type).

mod common;

use common::{join, Api};
use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use protocol::keys;
use protocol::messages::{AddShardsRequest, GroupDescription};
use protocol::names::{GroupName, StreamName};
use std::time::{Duration, Instant};
use test_support::timings::{MEMBER_TTL, TICK};
use test_support::{wait_for, wait_until, RedisServer};

/// The stream and group of the member that goes silent.
const S: &str = "orders";
const G: &str = "billing";
/// Another stream with a group: its routing is the one damaged in the routing tests.
const OTHER: &str = "payments";
/// A short safety sweep, so the bound it gives is well within the test.
const SWEEP: Duration = Duration::from_secs(2);
/// How long any condition is waited for: far beyond every bound, so a test that fails on the bound fails on
/// its own assertion rather than on this deadline where it can.
const WAIT: Duration = Duration::from_secs(30);

const DAMAGED: &str = "redis_stream_coord_damaged_keys_total";
const REPAIRS: &str = "redis_stream_coord_damaged_key_repairs_total";

fn config(redis: &RedisServer) -> Config {
    let mut config = common::config(&redis.url());
    config.due_sweep_period = SWEEP;
    config
}

/// The bound of the docs: the member's TTL, then at most one sweep period until a visit, and some ticks (and a
/// mutex wait) of rounding.
fn bound() -> Duration {
    MEMBER_TTL + SWEEP + TICK * 10 + Duration::from_secs(1)
}

fn names(stream: &str, group: &str) -> (StreamName, GroupName) {
    (
        StreamName::new(stream).expect("stream name"),
        GroupName::new(group).expect("group name"),
    )
}

fn index_member(stream: &str, group: &str) -> String {
    let (s, g) = names(stream, group);
    keys::groups_index_member(&s, &g)
}

fn routing_key(stream: &str) -> String {
    keys::stream_routing(&StreamName::new(stream).expect("stream name"))
}

async fn run<T: redis::FromRedisValue>(redis: &RedisServer, cmd: &mut redis::Cmd) -> T {
    let mut conn = redis.connection().await;
    cmd.query_async(&mut conn).await.expect("Redis command")
}

/// Replaces `key` by a string: the wrong type for every coordinator key.
async fn make_string(redis: &RedisServer, key: &str) {
    let _: i64 = run(redis, redis::cmd("DEL").arg(key)).await;
    let _: () = run(redis, redis::cmd("SET").arg(key).arg("not what you think")).await;
}

async fn del(redis: &RedisServer, key: &str) {
    let _: i64 = run(redis, redis::cmd("DEL").arg(key)).await;
}

async fn key_type(redis: &RedisServer, key: &str) -> String {
    run(redis, redis::cmd("TYPE").arg(key)).await
}

/// The sum of a counter's series whose labels include every one of `labels`, from the coordinator's own scrape.
async fn counter(coord: &CoordinatorHandle, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = coord.coordinator().render_metrics().await;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn wait_counted(coord: &CoordinatorHandle, name: &str, labels: &[(&str, &str)]) {
    let what = format!("{name} {labels:?} to count");
    wait_until(WAIT, &what, || async { counter(coord, name, labels).await >= 1.0 }).await;
}

/// Waits until the join's commit scored `stream`/`group` in the due index (so what the test does to the index
/// afterwards is what the coordinator must live with).
async fn wait_scored(redis: &RedisServer, stream: &str, group: &str) {
    let member = index_member(stream, group);
    wait_until(WAIT, "the join to score its group", || async {
        let mut conn = redis.connection().await;
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(keys::due_index())
            .arg(&member)
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        score.is_some_and(|s| s.is_finite() && s > 0.0)
    })
    .await;
}

/// A coordinator with the group of the silent member (`S`/`G`) and a second stream's group (`OTHER`/`G`). The
/// coordinator's start-up grace (one TTL from its first load of a group, at creation) ends before the lease of
/// any member that joins afterwards, so it never is what an expiry waits for.
async fn setup(redis: &RedisServer) -> (CoordinatorHandle, Api) {
    let coord = CoordinatorHandle::spawn(config(redis))
        .await
        .expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    api.create_group(OTHER, G, 2).await;
    (coord, api)
}

/// How long after `silent_since` the coordinator removed `member` (and with it its shards) from `stream`/`group`;
/// panics after [`WAIT`].
async fn silent_member_expires(api: &Api, stream: &str, group: &str, member: &str, silent_since: Instant) -> Duration {
    let what = format!("{member} of {stream}/{group} to expire");
    wait_for(WAIT, &what, || async {
        let d: GroupDescription = api.describe(stream, group).await;
        let gone = !d.members.iter().any(|m| m.member_id.as_str() == member);
        gone.then(|| silent_since.elapsed())
    })
    .await
}

fn assert_within_bound(expired: Duration, what: &str) {
    let bound = bound();
    assert!(expired <= bound, "{what}: expired after {expired:?}, bound {bound:?}");
    println!("{what}: expired after {expired:?} (bound {bound:?})");
}

// ---- the due index ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_index_of_the_wrong_type_is_reported_and_rebuilt_and_expiry_keeps_its_bound() {
    let redis = RedisServer::start().await;
    let (coord, api) = setup(&redis).await;
    api.hb(S, G, &join("m")).await;
    wait_scored(&redis, S, G).await;
    make_string(&redis, &keys::due_index()).await;
    let silent_since = Instant::now();
    let expired = silent_member_expires(&api, S, G, "m", silent_since).await;
    assert_within_bound(expired, "due index of the wrong type");
    wait_counted(&coord, DAMAGED, &[("key", "due_index"), ("damage", "wrong_type")]).await;
    wait_counted(&coord, REPAIRS, &[("key", "due_index")]).await;
    // Rebuilt from the groups index: a sorted set again, holding every group.
    assert_eq!(key_type(&redis, &keys::due_index()).await, "zset");
    for stream in [S, OTHER] {
        let score: Option<f64> = run(
            &redis,
            redis::cmd("ZSCORE").arg(keys::due_index()).arg(index_member(stream, G)),
        )
        .await;
        assert!(score.is_some(), "{stream}/{G} is back in the due index");
    }
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_members_of_the_due_index_are_counted_and_removed_and_stop_no_expiry() {
    let redis = RedisServer::start().await;
    let (coord, api) = setup(&redis).await;
    api.hb(S, G, &join("m")).await;
    wait_scored(&redis, S, G).await;
    // A sorted set cannot hold a score that is not a number (ZADD refuses NaN): garbage is in the members, and
    // in scores that make them due before everything else.
    let garbage = [
        "no colon",
        ":",
        "orders:",
        ":billing",
        "bad stream name!:g",
        "\u{0}:\u{1}",
    ];
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(keys::due_index());
    for g in garbage {
        zadd.arg("-inf").arg(g);
    }
    let _: i64 = run(&redis, &mut zadd).await;
    let silent_since = Instant::now();
    let expired = silent_member_expires(&api, S, G, "m", silent_since).await;
    assert_within_bound(expired, "due index with garbage members");
    wait_counted(&coord, DAMAGED, &[("key", "due_index"), ("damage", "garbage")]).await;
    for g in garbage {
        let score: Option<f64> = run(&redis, redis::cmd("ZSCORE").arg(keys::due_index()).arg(g)).await;
        assert!(score.is_none(), "{g:?} is out of the due index");
    }
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_due_index_is_reported_and_expiry_keeps_its_bound() {
    let redis = RedisServer::start().await;
    let (coord, api) = setup(&redis).await;
    api.hb(S, G, &join("m")).await;
    wait_scored(&redis, S, G).await;
    del(&redis, &keys::due_index()).await;
    let silent_since = Instant::now();
    let expired = silent_member_expires(&api, S, G, "m", silent_since).await;
    assert_within_bound(expired, "deleted due index");
    // The sweep found groups the index had lost, and scored them again.
    wait_counted(&coord, DAMAGED, &[("key", "due_index"), ("damage", "lost")]).await;
    wait_until(WAIT, "the sweep to score every group again", || async {
        let n: u64 = run(&redis, redis::cmd("ZCARD").arg(keys::due_index())).await;
        n == 2
    })
    .await;
    coord.shutdown().await;
}

// ---- the groups index (with the due index deleted too, so that expiry rests on the sweep alone) ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_index_of_the_wrong_type_is_swept_by_scan_and_rebuilt() {
    let redis = RedisServer::start().await;
    let (coord, api) = setup(&redis).await;
    api.hb(S, G, &join("m")).await;
    wait_scored(&redis, S, G).await;
    make_string(&redis, &keys::groups_index()).await;
    del(&redis, &keys::due_index()).await;
    let silent_since = Instant::now();
    let expired = silent_member_expires(&api, S, G, "m", silent_since).await;
    assert_within_bound(expired, "groups index of the wrong type");
    wait_counted(&coord, DAMAGED, &[("key", "groups_index"), ("damage", "wrong_type")]).await;
    wait_counted(&coord, REPAIRS, &[("key", "groups_index")]).await;
    // Rebuilt by SCAN: a set again, with both groups.
    assert_eq!(key_type(&redis, &keys::groups_index()).await, "set");
    let mut members: Vec<String> = run(&redis, redis::cmd("SMEMBERS").arg(keys::groups_index())).await;
    members.sort();
    let mut expected = vec![index_member(S, G), index_member(OTHER, G)];
    expected.sort();
    assert_eq!(members, expected);
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_members_of_the_groups_index_are_counted_and_stop_no_expiry() {
    let redis = RedisServer::start().await;
    let (coord, api) = setup(&redis).await;
    api.hb(S, G, &join("m")).await;
    wait_scored(&redis, S, G).await;
    let garbage = ["no colon", ":", "orders:", "bad stream name!:g"];
    let _: i64 = run(&redis, redis::cmd("SADD").arg(keys::groups_index()).arg(&garbage[..])).await;
    del(&redis, &keys::due_index()).await;
    let silent_since = Instant::now();
    let expired = silent_member_expires(&api, S, G, "m", silent_since).await;
    assert_within_bound(expired, "groups index with garbage members");
    wait_counted(&coord, DAMAGED, &[("key", "groups_index"), ("damage", "garbage")]).await;
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_groups_index_is_reported_and_rebuilt() {
    let redis = RedisServer::start().await;
    let (coord, api) = setup(&redis).await;
    api.hb(S, G, &join("m")).await;
    wait_scored(&redis, S, G).await;
    del(&redis, &keys::groups_index()).await;
    del(&redis, &keys::due_index()).await;
    let silent_since = Instant::now();
    let expired = silent_member_expires(&api, S, G, "m", silent_since).await;
    assert_within_bound(expired, "deleted groups index");
    wait_counted(&coord, DAMAGED, &[("key", "groups_index"), ("damage", "lost")]).await;
    wait_until(WAIT, "the groups index to be rebuilt", || async {
        let n: u64 = run(&redis, redis::cmd("SCARD").arg(keys::groups_index())).await;
        n == 2
    })
    .await;
    coord.shutdown().await;
}

// ---- a routing hash ----

/// What a routing test does to `OTHER`'s routing hash.
#[derive(Clone, Copy)]
enum RoutingDamage {
    /// A string instead of a hash.
    WrongType,
    /// A routing document that does not parse.
    Garbage,
    /// No routing hash at all.
    Deleted,
}

/// Damages `OTHER`'s routing, then checks that a silent member expires in `S`'s group (another stream) and in
/// `OTHER`'s own group, that `S`'s group still adopts a growth of `S`'s routing, and that the damage is counted
/// as `counted`.
async fn routing_damage_stops_nothing_else(damage: RoutingDamage, counted: &str) {
    let redis = RedisServer::start().await;
    let (coord, api) = setup(&redis).await;
    api.hb(S, G, &join("m")).await;
    api.hb(OTHER, G, &join("n")).await;
    wait_scored(&redis, S, G).await;
    wait_scored(&redis, OTHER, G).await;
    let key = routing_key(OTHER);
    match damage {
        RoutingDamage::WrongType => make_string(&redis, &key).await,
        RoutingDamage::Garbage => {
            let _: i64 = run(
                &redis,
                redis::cmd("HSET")
                    .arg(&key)
                    .arg(keys::fields::AGGREGATE)
                    .arg("{not json"),
            )
            .await;
        }
        RoutingDamage::Deleted => del(&redis, &key).await,
    }
    let silent_since = Instant::now();
    let expired = silent_member_expires(&api, S, G, "m", silent_since).await;
    assert_within_bound(expired, "a member of another stream than the damaged routing");
    let expired = silent_member_expires(&api, OTHER, G, "n", silent_since).await;
    assert_within_bound(expired, "a member of the stream whose routing is damaged");

    // Routing adoption of the healthy stream goes on.
    let before: GroupDescription = api.describe(S, G).await;
    let resp = api
        .post(&protocol::routes::shards(S), &AddShardsRequest { count: 1 })
        .await;
    let status = resp.status();
    assert!(
        status.is_success(),
        "growth: {status} {}",
        resp.text().await.unwrap_or_default()
    );
    wait_until(WAIT, "the healthy stream's group to adopt its growth", || async {
        let d: GroupDescription = api.describe(S, G).await;
        d.routing_version > before.routing_version && d.shard_count == before.shard_count + 1
    })
    .await;
    wait_counted(&coord, DAMAGED, &[("key", "routing"), ("damage", counted)]).await;
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routing_of_the_wrong_type_stops_no_expiry_nor_the_other_streams_adoption() {
    routing_damage_stops_nothing_else(RoutingDamage::WrongType, "wrong_type").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routing_with_a_garbage_document_stops_no_expiry_nor_the_other_streams_adoption() {
    routing_damage_stops_nothing_else(RoutingDamage::Garbage, "garbage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_routing_stops_no_expiry_nor_the_other_streams_adoption() {
    routing_damage_stops_nothing_else(RoutingDamage::Deleted, "lost").await;
}

// ---- the repair itself ----

/// The replacement checks the type in its own script: an index of the right type (another replica repaired it, or
/// it was never damaged) is left as it is, a missing one is not created, and one of the wrong type is replaced
/// whole, also beyond one batch of members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_is_replaced_only_when_of_the_wrong_type_and_then_whole() {
    let redis = RedisServer::start().await;
    let coord = CoordinatorHandle::spawn(config(&redis))
        .await
        .expect("coordinator starts");
    let store = coord.coordinator().store();
    let members: Vec<String> = (0..2_500).map(|i| format!("s{}:g{i}", i % 7)).collect();

    let _: i64 = run(
        &redis,
        redis::cmd("ZADD").arg(keys::due_index()).arg(42).arg("orders:billing"),
    )
    .await;
    assert!(!store.replace_due_index_of_wrong_type(&members).await.expect("replace"));
    let kept: Vec<String> = run(&redis, redis::cmd("ZRANGE").arg(keys::due_index()).arg(0).arg(-1)).await;
    assert_eq!(kept, ["orders:billing"], "a sorted set is kept as it is");
    del(&redis, &keys::groups_index()).await;
    assert!(!store
        .replace_groups_index_of_wrong_type(&members)
        .await
        .expect("replace"));
    assert_eq!(
        key_type(&redis, &keys::groups_index()).await,
        "none",
        "a missing index is left to the sweep"
    );

    make_string(&redis, &keys::due_index()).await;
    assert!(store.replace_due_index_of_wrong_type(&members).await.expect("replace"));
    let n: u64 = run(&redis, redis::cmd("ZCOUNT").arg(keys::due_index()).arg(0).arg(0)).await;
    assert_eq!(n, members.len() as u64, "every group, due at once");
    let _: () = run(&redis, redis::cmd("HSET").arg(keys::groups_index()).arg("f").arg("v")).await;
    assert!(store
        .replace_groups_index_of_wrong_type(&members)
        .await
        .expect("replace"));
    let n: u64 = run(&redis, redis::cmd("SCARD").arg(keys::groups_index())).await;
    assert_eq!(n, members.len() as u64);
    coord.shutdown().await;
}
