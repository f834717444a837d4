//! The tick loop visits what is due (issue 34): with many idle groups and one member whose lease runs out, the
//! idle groups are not visited each tick (only by the slow safety sweep), the member still expires on time, and a
//! deleted due index only delays expiry up to the sweep's period.
//!
//! `DUE_TEST_GROUPS` sets how many idle groups (default 200); the rate test prints the tick loop's Redis
//! commands per second, with the due index and with a sweep as fast as the tick (every group each tick, what the
//! loop did before the index).

mod common;

use common::{join, Api};
use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use protocol::keys;
use protocol::messages::GroupDescription;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use test_support::timings::MEMBER_TTL;
use test_support::{wait_for, RedisServer};

/// Streams the idle groups are spread over.
const STREAMS: usize = 10;
/// The stream and group of the member that expires.
const S: &str = "orders";
const G: &str = "billing";
/// The production tick interval: the rate is the one a deployment would see.
const TICK: Duration = Duration::from_millis(250);
/// Window over which a rate is measured.
const WINDOW: Duration = Duration::from_secs(4);

fn idle_groups() -> usize {
    std::env::var("DUE_TEST_GROUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn config(redis: &RedisServer, sweep: Duration) -> Config {
    let mut config = common::config(&redis.url());
    config.tick_interval = TICK;
    config.due_sweep_period = sweep;
    config
}

async fn commands_processed(redis: &RedisServer) -> u64 {
    let mut conn = redis.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has total_commands_processed")
}

/// Tick visits of the coordinator so far (due and sweep).
fn visits(coord: &CoordinatorHandle) -> u64 {
    let stats = coord.coordinator().stats();
    stats.tick_visits_due.load(Ordering::Relaxed) + stats.tick_visits_sweep.load(Ordering::Relaxed)
}

/// Redis commands per second and tick visits per second over [`WINDOW`], while nobody sends a request.
async fn idle_rates(redis: &RedisServer, coord: &CoordinatorHandle) -> (f64, f64) {
    let (commands, visited) = (commands_processed(redis).await, visits(coord));
    let started = Instant::now();
    // Measuring a rate needs a window; no correctness depends on its length.
    tokio::time::sleep(WINDOW).await;
    let secs = started.elapsed().as_secs_f64();
    let commands = (commands_processed(redis).await - commands) as f64 / secs;
    ((commands), (visits(coord) - visited) as f64 / secs)
}

async fn create_idle_groups(api: &Api, n: usize) {
    for i in 0..n {
        api.create_group(&format!("s{}", i % STREAMS), &format!("g{i}"), 2)
            .await;
    }
    api.create_group(S, G, 2).await;
}

/// How many groups the due index holds, and how many of them are due by Redis time.
async fn index_counts(redis: &RedisServer) -> (u64, u64) {
    let mut conn = redis.connection().await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.expect("TIME");
    let now = secs * 1000 + micros / 1000;
    let total: u64 = redis::cmd("ZCARD")
        .arg(keys::due_index())
        .query_async(&mut conn)
        .await
        .expect("ZCARD");
    let due: u64 = redis::cmd("ZCOUNT")
        .arg(keys::due_index())
        .arg("-inf")
        .arg(now)
        .query_async(&mut conn)
        .await
        .expect("ZCOUNT");
    (total, due)
}

/// Joins `member` to the expiring group, stops its heartbeats, and returns how long the coordinator took to
/// expire it.
async fn expiry_time(api: &Api, member: &str, within: Duration) -> Duration {
    api.hb(S, G, &join(member)).await;
    let silent_since = Instant::now();
    wait_for(within, "the silent member to expire", || async {
        let d: GroupDescription = api.describe(S, G).await;
        (!d.members.iter().any(|m| m.member_id.as_str() == member)).then(|| silent_since.elapsed())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_groups_are_not_visited_each_tick() {
    let n = idle_groups();
    let redis = RedisServer::start().await;
    let sweep = coord_server::due::SWEEP_PERIOD;
    let setup = CoordinatorHandle::spawn(config(&redis, sweep))
        .await
        .expect("coordinator starts");
    let api = Api::new(setup.url());
    create_idle_groups(&api, n).await;
    // Every created group is due once (it has no deadline yet); after that visit none is.
    wait_for(
        Duration::from_secs(120),
        "every created group to be visited and scored",
        || async {
            let (total, due) = index_counts(&redis).await;
            (total == n as u64 + 1 && due == 0).then_some(())
        },
    )
    .await;
    setup.shutdown().await;

    // What the loop cost before the index: every group each tick (a sweep as fast as the tick).
    let every_tick = CoordinatorHandle::spawn(config(&redis, TICK))
        .await
        .expect("coordinator starts");
    wait_for(Duration::from_secs(120), "the sweep to visit every group", || async {
        (visits(&every_tick) > n as u64 + 1).then_some(())
    })
    .await;
    let (commands_before, visited_before) = idle_rates(&redis, &every_tick).await;
    every_tick.shutdown().await;

    // With the index: a coordinator started after the groups exist, so its first sweep round covers them all and
    // the window sees the sweep's steady share.
    let coord = CoordinatorHandle::spawn(config(&redis, sweep))
        .await
        .expect("coordinator starts");
    let api = Api::new(coord.url());
    wait_for(Duration::from_secs(10), "the first tick", || async {
        (visits(&coord) > 0).then_some(())
    })
    .await;
    let (commands, visited) = idle_rates(&redis, &coord).await;
    let ticks = WINDOW.as_secs_f64() / TICK.as_secs_f64();
    // Before the index every tick visited every group: n + 1 visits per tick. Now only the sweep's share.
    let sweep_share = (n + 1) as f64 / sweep.as_secs_f64();
    assert!(
        visited <= sweep_share * 1.5 + 2.0,
        "{visited:.1} visits/s with {n} idle groups; the sweep alone makes {sweep_share:.1}/s"
    );
    assert!(visited * WINDOW.as_secs_f64() < (n as f64) * ticks / 10.0);

    // The one member whose lease runs out is expired on time: within its TTL (the coordinator's start-up grace
    // is one TTL from its first load of the group, over by now), a tick and a mutex wait.
    let expiry = expiry_time(&api, "m", Duration::from_secs(30)).await;
    assert!(
        expiry <= MEMBER_TTL + TICK * 4 + Duration::from_secs(1),
        "the member expired after {expiry:?} (TTL {MEMBER_TTL:?})"
    );
    let due_visits = coord.coordinator().stats().tick_visits_due.load(Ordering::Relaxed);
    coord.shutdown().await;
    println!(
        "{n} idle groups + 1, tick {TICK:?}: {commands:.0} Redis commands/s and {visited:.1} visits/s with the due \
         index (sweep {sweep:?}); {commands_before:.0} commands/s and {visited_before:.1} visits/s visiting every \
         group each tick; expiry after {expiry:?}, {due_visits} due visits"
    );
    assert!(
        commands * 5.0 < commands_before,
        "{commands:.0}/s with the index, {commands_before:.0}/s without"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_due_index_still_expires_within_the_sweep_period() {
    let n = idle_groups() / 4;
    let redis = RedisServer::start().await;
    let sweep = Duration::from_secs(5);
    let coord = CoordinatorHandle::spawn(config(&redis, sweep))
        .await
        .expect("coordinator starts");
    let api = Api::new(coord.url());
    create_idle_groups(&api, n).await;
    api.hb(S, G, &join("m")).await;
    let mut conn = redis.connection().await;
    let member = keys::groups_index_member(
        &protocol::names::StreamName::new(S).expect("name"),
        &protocol::names::GroupName::new(G).expect("name"),
    );
    wait_for(Duration::from_secs(30), "the join to score its group", || async {
        let mut conn = redis.connection().await;
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(keys::due_index())
            .arg(&member)
            .query_async(&mut conn)
            .await
            .expect("ZSCORE");
        score.filter(|s| s.is_finite() && *s > 0.0).map(|_| ())
    })
    .await;
    let _: () = redis::cmd("DEL")
        .arg(keys::due_index())
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let silent_since = Instant::now();
    let expired = wait_for(
        Duration::from_secs(60),
        "the member to expire without the index",
        || async {
            let d: GroupDescription = api.describe(S, G).await;
            d.members.is_empty().then(|| silent_since.elapsed())
        },
    )
    .await;
    // The sweep visits every group within its period (plus a tick of rounding), once the lease ended.
    let bound = MEMBER_TTL + sweep + TICK * 4 + Duration::from_secs(1);
    assert!(expired <= bound, "expired after {expired:?}, bound {bound:?}");
    // And the sweep wrote the index again, for every group.
    wait_for(Duration::from_secs(30), "the sweep to rebuild the index", || async {
        let (total, _) = index_counts(&redis).await;
        (total == n as u64 + 1).then_some(())
    })
    .await;
    println!("with the due index deleted the member expired after {expired:?} (TTL {MEMBER_TTL:?}, sweep {sweep:?})");
    coord.shutdown().await;
}

/// Calls of one Redis command so far (`INFO commandstats`).
async fn calls(redis: &RedisServer, command: &str) -> u64 {
    let mut conn = redis.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_that_only_renew_leases_write_no_score() {
    let redis = RedisServer::start().await;
    let coord = CoordinatorHandle::spawn(config(&redis, coord_server::due::SWEEP_PERIOD))
        .await
        .expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    let mut last = api.hb(S, G, &join("a")).await;
    // Settle: the member reads what it was given; from then on its heartbeats change nothing but its lease.
    for _ in 0..3 {
        let reading = common::reading_after(&last, &last.assigned);
        last = api.hb(S, G, &common::follow_up(&last, &reading)).await;
    }
    let (zadd, visited) = (calls(&redis, "zadd").await, visits(&coord));
    const BEATS: u64 = 30;
    for _ in 0..BEATS {
        let reading = common::reading_after(&last, &last.assigned);
        last = api.hb(S, G, &common::follow_up(&last, &reading)).await;
    }
    let (zadd, visited) = (calls(&redis, "zadd").await - zadd, visits(&coord) - visited);
    // Only tick visits (at most one `ZADD` each, one per tick in fact) wrote scores, not the heartbeats.
    assert!(
        zadd <= visited && zadd < BEATS / 2,
        "{zadd} ZADDs during {BEATS} renewals and {visited} tick visits"
    );
    coord.shutdown().await;
}

/// A group whose members have joined, read what they were given and stay within long leases has nothing due:
/// after it settled, the tick loop does not visit it (the sweep's slow share aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_group_with_live_members_is_not_visited_each_tick() {
    let redis = RedisServer::start().await;
    let coord = CoordinatorHandle::spawn(config(&redis, Duration::from_secs(3600)))
        .await
        .expect("coordinator starts");
    let api = Api::new(coord.url());
    let mut timings = common::timings();
    timings.member_ttl_ms = 3_600_000;
    timings.assignment_lease_ms = 1_800_000;
    api.create_group_with(S, G, 4, timings).await;
    let mut last = Vec::new();
    for m in ["a", "b"] {
        last.push(api.hb(S, G, &join(m)).await);
    }
    // Heartbeats (each member reporting what it reads) until a whole round changes nothing.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut next = Vec::new();
        for p in &last {
            next.push(api.hb(S, G, &common::follow_up(p, &p.assigned)).await);
        }
        let quiet = next
            .iter()
            .zip(&last)
            .all(|(n, p)| n.metadata_version == p.metadata_version && n.pending.is_empty());
        last = next;
        if quiet {
            break;
        }
        assert!(Instant::now() < deadline, "the group settles: {last:?}");
    }
    let (_, due) = index_counts(&redis).await;
    let before = visits(&coord);
    // Long enough for the 250 ms tick to run 8 times: a group left due would be visited at each.
    tokio::time::sleep(TICK * 8).await;
    let visited = visits(&coord) - before;
    let (total, due_after) = index_counts(&redis).await;
    assert!(
        visited <= 1 && due_after == 0,
        "a settled group was visited {visited} times in 8 ticks; index: {total} entries, {due} then {due_after} due"
    );
    coord.shutdown().await;
}

/// The safety sweep's visits do not tend routings (Redis loses shard records only with a restart or failover,
/// which the tick sees), but a coordinator that starts cannot know what Redis lost while none ran: its first tick
/// tends every stream with a group, also one whose group nothing makes due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_lost_while_no_coordinator_ran_is_written_again_by_the_next_ones_first_tick() {
    let redis = RedisServer::start().await;
    let hour = Duration::from_secs(3600);
    let first = CoordinatorHandle::spawn(config(&redis, hour))
        .await
        .expect("coordinator starts");
    Api::new(first.url()).create_group(S, G, 4).await;
    wait_for(
        Duration::from_secs(10),
        "the new group to be visited and scored",
        || async { (index_counts(&redis).await == (1, 0)).then_some(()) },
    )
    .await;
    first.shutdown().await;

    let stream = protocol::names::StreamName::new(S).expect("stream name");
    let record = keys::shard_fence(&stream, protocol::ShardId(1));
    let mut conn = redis.connection().await;
    let born = |mut conn: redis::aio::MultiplexedConnection| {
        let record = record.clone();
        async move {
            let v: Option<String> = redis::cmd("HGET")
                .arg(&record)
                .arg(keys::shard_fence_fields::BORN_VERSION)
                .query_async(&mut conn)
                .await
                .expect("HGET");
            v
        }
    };
    let before = born(conn.clone()).await.expect("shard 1's record");
    let _: i64 = redis::cmd("HDEL")
        .arg(&record)
        .arg(keys::shard_fence_fields::BORN_VERSION)
        .query_async(&mut conn)
        .await
        .expect("HDEL");

    let second = CoordinatorHandle::spawn(config(&redis, hour))
        .await
        .expect("coordinator starts");
    let again = wait_for(Duration::from_secs(10), "the lost record to be written again", || {
        let conn = conn.clone();
        async move { born(conn).await }
    })
    .await;
    assert_eq!(again, before, "written again with the birth the routing gives it");
    let stats = second.coordinator().stats();
    assert_eq!(
        stats.tick_visits_due.load(Ordering::Relaxed),
        0,
        "no visit made the group due: the first tick's tending did it"
    );
    second.shutdown().await;
}
