//! The coordinator on a local Redis Cluster (issue 15), through `REDIS_URL=cluster:<seed URLs>`, with wire
//! members (level 2):
//! - groups whose metadata lands on each of the 3 masters are joined, heartbeated and fully assigned, and every
//!   read that spans slots or nodes answers (describe, routing, status page, lag metrics, the "never created" /
//!   "lost" traces, the index rebuild by `SCAN` on every master);
//! - a coordinator restart on the same cluster keeps every group and every member's epoch and shards;
//! - a live migration of a group's metadata slot while its members heartbeat: no lease lapses, no correction round,
//!   the revision only grows;
//! - a lossy failover (`TAKEOVER` by a replica that missed the last write) of the master holding group A opens A's
//!   correction round, and not that of group B on another master.

mod common;

use common::*;
use protocol::keys;
use protocol::messages::{GroupDescription, RevokeState};
use protocol::names::{GroupName, StreamName};
use protocol::{MetadataVersion, ShardId, Status};
use reqwest::StatusCode;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use test_support::cluster::{even_slot_ranges, key_slot, RedisCluster};
use test_support::wait_for;
use tokio::sync::watch;

const STREAM: &str = "orders";
/// Junk X writes while its replica is stopped: more than any loopback socket buffers (see the failover test).
const JUNK_VALUES: usize = 4;
const JUNK_VALUE_BYTES: usize = 16 << 20;
const SHARDS: u32 = 4;

/// The coordinator's Redis target for `cluster`: every node a seed.
fn target(cluster: &RedisCluster) -> String {
    format!("cluster:{}", cluster.urls().join(","))
}

fn stream() -> StreamName {
    StreamName::new(STREAM).unwrap()
}

/// The start-order index of the master that serves `key`'s slot in a freshly started cluster (the even split).
fn initial_master_of(key: &str) -> usize {
    let slot = key_slot(key.as_bytes());
    even_slot_ranges(3)
        .iter()
        .position(|&(first, last)| (first..=last).contains(&slot))
        .expect("every slot has a master")
}

/// `per_master` group names on [`STREAM`] for each of the 3 masters, with that master.
fn groups_on_every_master(per_master: usize) -> Vec<(GroupName, usize)> {
    let mut count = [0usize; 3];
    let mut out = Vec::new();
    for i in 0.. {
        let group = GroupName::new(format!("g{i}")).unwrap();
        let master = initial_master_of(&keys::group_metadata(&stream(), &group));
        if count[master] < per_master {
            count[master] += 1;
            out.push((group, master));
        }
        if count.iter().all(|&c| c == per_master) {
            return out;
        }
    }
    unreachable!()
}

fn group_api(coord: &Coord, group: &GroupName) -> GroupApi {
    GroupApi {
        api: coord.api(),
        stream: STREAM.to_owned(),
        group: group.to_string(),
    }
}

/// Heartbeats `members` until each reads its even share of the shards and nothing is left to drain.
async fn settle(api: &GroupApi, members: &mut [WireMember]) {
    let share = SHARDS as usize / members.len();
    let members = tokio::sync::Mutex::new(members);
    wait_for(DEADLINE, &format!("group {} to settle", api.group), || async {
        let mut members = members.lock().await;
        let mut all_ok = true;
        for m in members.iter_mut() {
            all_ok &= m.ok_retrying(api).await.status == Status::Ok;
        }
        let even = members
            .iter()
            .all(|m| m.reading.len() == share && m.revoking.is_empty());
        (all_ok && even).then_some(())
    })
    .await;
}

/// Creates every group of `placed` and settles two wire members (`a`, `b`) in each; answers them per group.
async fn create_and_settle(coord: &Coord, placed: &[(GroupName, usize)]) -> Vec<Vec<WireMember>> {
    let mut members = Vec::new();
    for (group, _) in placed {
        let api = group_api(coord, group);
        api.create(SHARDS).await.expect("group created");
        let mut pair = vec![WireMember::new("a"), WireMember::new("b")];
        settle(&api, &mut pair).await;
        members.push(pair);
    }
    members
}

fn lost_status(r: Result<GroupDescription, Refusal>) -> Status {
    match r {
        Ok(g) => panic!("expected a refusal, got {g:?}"),
        Err((_, body)) => body.status,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_on_every_master_are_served_and_every_cross_slot_read_answers() {
    init_tracing();
    let cluster = RedisCluster::start().await;
    let coord = Coord::start(&target(&cluster)).await;
    let placed = groups_on_every_master(2);
    let members = create_and_settle(&coord, &placed).await;
    for ((group, master), pair) in placed.iter().zip(&members) {
        let owner = cluster.owner_of_key(&keys::group_metadata(&stream(), group)).await;
        assert_eq!(owner, *master, "{group}'s metadata on master {master}");
        let g = group_api(&coord, group).describe().await.expect("describe");
        assert_eq!(g.members.len(), 2, "{g:?}");
        assert!(g.shards.iter().all(|s| s.owner.is_some()), "{g:?}");
        assert_eq!(pair.iter().map(|m| m.reading.len()).sum::<usize>(), SHARDS as usize);
    }
    let api = group_api(&coord, &placed[0].0);
    let routing = api.describe_routing().await.expect("routing");
    assert_eq!(routing.shard_count, SHARDS);

    // Lag: Redis consumer groups on every shard of two groups, the shards spread over the masters.
    let mut con = cluster.connection().await;
    let shard_masters: BTreeSet<usize> = (0..SHARDS)
        .map(|n| initial_master_of(&keys::shard_stream(&stream(), ShardId(n))))
        .collect();
    assert!(shard_masters.len() > 1, "the shards span masters: {shard_masters:?}");
    for (group, _) in placed.iter().take(2) {
        for n in 0..SHARDS {
            let key = keys::shard_stream(&stream(), ShardId(n));
            let _: String = redis::cmd("XADD")
                .arg(&key)
                .arg("*")
                .arg("f")
                .arg("v")
                .query_async(&mut con)
                .await
                .expect("XADD");
            let created: redis::RedisResult<()> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&key)
                .arg(group.as_str())
                .arg("0")
                .query_async(&mut con)
                .await;
            created.expect("XGROUP CREATE");
        }
    }
    let metrics = coord.api().metrics().await;
    println!(
        "lag lines: {:?}",
        metrics.lines().filter(|l| l.contains("shard_lag")).collect::<Vec<_>>()
    );
    for (group, _) in placed.iter().take(2) {
        for n in 0..SHARDS {
            let line = format!("redis_stream_coord_shard_lag{{stream=\"{STREAM}\",group=\"{group}\",shard=\"{n}\"}} 2");
            assert!(metrics.contains(&line), "no `{line}` in\n{metrics}");
        }
    }
    let status = coord
        .api()
        .http
        .get(coord.api().url("/status"))
        .send()
        .await
        .expect("status page answers");
    assert!(status.status().is_success(), "{}", status.status());

    // The index rebuilt by SCAN on every master finds every group; the index alone no longer does once deleted.
    let admin = api.admin();
    let _: () = redis::cmd("DEL")
        .arg(keys::groups_index())
        .query_async(&mut con)
        .await
        .expect("DEL index");
    assert!(admin.list_groups(false).await.expect("list").groups.is_empty());
    let rebuilt = admin.list_groups(true).await.expect("rebuild");
    let want: BTreeSet<String> = placed.iter().map(|(g, _)| g.to_string()).collect();
    let found: BTreeSet<String> = rebuilt.groups.iter().map(|g| g.group.to_string()).collect();
    assert_eq!(found, want);

    // Traces span slots: a name never used is NOT_FOUND, a group whose metadata vanished is lost (its index entry
    // and liveness hash remain), a stream never created is NOT_FOUND too.
    let never = GroupApi {
        group: "never-created".into(),
        ..api.clone()
    };
    assert_eq!(lost_status(never.describe().await), Status::NotFound);
    let lost = &placed[2].0;
    let _: () = redis::cmd("DEL")
        .arg(keys::group_metadata(&stream(), lost))
        .query_async(&mut con)
        .await
        .expect("DEL metadata");
    assert_eq!(
        lost_status(group_api(&coord, lost).describe().await),
        Status::MetadataUnavailable
    );
    let no_stream = GroupApi {
        stream: "no-such-stream".into(),
        ..api.clone()
    };
    let refused = refusal(no_stream.admin().routing("no-such-stream").await).expect_err("no routing");
    assert_eq!(refused.1.status, Status::NotFound, "{refused:?}");

    // The run id check and TIME ask every master; no Redis restart is seen.
    assert!(!coord.coordinator().check_redis_restart().await.expect("run ids"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_restart_on_the_cluster_keeps_every_group() {
    init_tracing();
    let cluster = RedisCluster::start().await;
    let mut coord = Coord::start(&target(&cluster)).await;
    let placed = groups_on_every_master(1);
    let mut members = create_and_settle(&coord, &placed).await;
    let mut before: Vec<GroupDescription> = Vec::new();
    for (g, _) in &placed {
        before.push(group_api(&coord, g).describe().await.expect("describe"));
    }

    coord.shutdown().await;
    coord.restart().await;

    for (((group, _), pair), was) in placed.iter().zip(&mut members).zip(&before) {
        let api = group_api(&coord, group);
        for m in pair.iter_mut() {
            let (epoch, reading) = (m.epoch, m.reading.clone());
            let r = m.ok_retrying(&api).await;
            assert_eq!(r.status, Status::Ok, "{group} {}: {r:?}", m.id);
            assert_eq!((m.epoch, &m.reading), (epoch, &reading), "{group} {}", m.id);
        }
        let now = api.describe().await.expect("describe after restart");
        assert_eq!(now.metadata_version, was.metadata_version, "{group}");
        assert_eq!(now.members.len(), 2);
        assert!(
            now.correction.is_none(),
            "a restart of the coordinator is no loss: {now:?}"
        );
    }
    let listed = group_api(&coord, &placed[0].0)
        .admin()
        .list_groups(false)
        .await
        .expect("list");
    assert_eq!(listed.groups.len(), placed.len(), "{listed:?}");
}

/// What one background heartbeat got.
#[derive(Debug, Clone)]
struct Beat {
    at: Instant,
    member: usize,
    answer: Result<(Status, MetadataVersion), (StatusCode, Status)>,
}

/// Heartbeats `members` every [`HEARTBEAT`] until `stop`, recording every answer.
fn heartbeat_in_background(
    api: GroupApi,
    members: Vec<WireMember>,
    stop: watch::Receiver<bool>,
) -> (Arc<Mutex<Vec<Beat>>>, tokio::task::JoinHandle<Vec<WireMember>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let record = log.clone();
    let task = tokio::spawn(async move {
        let mut members = members;
        while !*stop.borrow() {
            for (i, m) in members.iter_mut().enumerate() {
                let answer = m
                    .beat(&api, RevokeState::Revoked)
                    .await
                    .map(|r| (r.status, r.metadata_version))
                    .map_err(|(code, body)| (code, body.status));
                record.lock().unwrap().push(Beat {
                    at: Instant::now(),
                    member: i,
                    answer,
                });
            }
            // Real time: the members' heartbeat interval, which their leases are measured against.
            tokio::time::sleep(HEARTBEAT).await;
        }
        members
    });
    (log, task)
}

fn oks_of(log: &Mutex<Vec<Beat>>, member: usize) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|b| b.member == member && matches!(b.answer, Ok((Status::Ok, _))))
        .count()
}

/// Checks that every answer in `beats` (of `members` members) was OK or a retryable 503, with versions that never
/// go back; answers the longest gap between one member's OK answers and the number of refusals.
fn only_ok_or_retryable(beats: &[Beat], members: usize) -> (Duration, usize) {
    let mut worst_gap = Duration::ZERO;
    let mut refusals = 0;
    for m in 0..members {
        let mut last_ok: Option<Instant> = None;
        let mut last_version = MetadataVersion(0);
        for b in beats.iter().filter(|b| b.member == m) {
            match b.answer {
                Ok((status, version)) => {
                    assert_eq!(status, Status::Ok, "member {m} got {status}: {b:?}");
                    assert!(version >= last_version, "{b:?}");
                    last_version = version;
                    if let Some(prev) = last_ok {
                        worst_gap = worst_gap.max(b.at - prev);
                    }
                    last_ok = Some(b.at);
                }
                Err((code, status)) => {
                    assert!(
                        code == StatusCode::SERVICE_UNAVAILABLE && status.is_retryable(),
                        "member {m}: only retryable refusals, got {code} {status}"
                    );
                    refusals += 1;
                }
            }
        }
    }
    (worst_gap, refusals)
}

async fn wait_oks(log: &Mutex<Vec<Beat>>, members: usize, more: usize, what: &str) {
    let start: Vec<usize> = (0..members).map(|m| oks_of(log, m)).collect();
    wait_for(DEADLINE, what, || async {
        (0..members).all(|m| oks_of(log, m) >= start[m] + more).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_migration_of_a_groups_metadata_slot_loses_no_lease_and_opens_no_round() {
    init_tracing();
    let cluster = RedisCluster::start().await;
    let coord = Coord::start(&target(&cluster)).await;
    let (group, from) = groups_on_every_master(1).remove(0);
    let api = group_api(&coord, &group);
    api.create(SHARDS).await.expect("group created");
    let mut pair = vec![WireMember::new("a"), WireMember::new("b")];
    settle(&api, &mut pair).await;
    let revision_before = api.describe().await.expect("describe").revision;

    let (stop_tx, stop) = watch::channel(false);
    let (log, task) = heartbeat_in_background(api.clone(), pair, stop);
    wait_oks(&log, 2, 3, "heartbeats before the migration").await;

    let slot = key_slot(keys::group_metadata(&stream(), &group).as_bytes());
    let to = (from + 1) % 3;
    let started = Instant::now();
    let migration = cluster.begin_migration(slot, to).await;
    wait_oks(&log, 2, 2, "heartbeats while the slot is MIGRATING/IMPORTING").await;
    let mut moved = 0;
    // One key at a time: the slot's keys are split between the nodes for a while (ASK, TRYAGAIN).
    loop {
        let n = migration.move_keys(1).await;
        if n == 0 {
            break;
        }
        moved += n;
    }
    migration.finish().await;
    let migrated_in = started.elapsed();
    assert!(moved >= 2, "the metadata and liveness hashes moved ({moved} keys)");
    assert_eq!(cluster.owner_of_slot(slot).await, to);
    wait_oks(&log, 2, 5, "heartbeats after the migration").await;
    let _ = stop_tx.send(true);
    let members = task.await.expect("heartbeat task");

    let (worst_gap, refusals) = only_ok_or_retryable(&log.lock().unwrap(), 2);
    println!(
        "migration of slot {slot} ({moved} keys, node {from} -> {to}) took {migrated_in:?}; {} heartbeats, \
         {refusals} retryable refusals, longest gap between OK answers {worst_gap:?} (lease {LEASE:?})",
        log.lock().unwrap().len()
    );
    assert!(worst_gap < LEASE, "a lease lapsed: {worst_gap:?} between OK answers");
    let g = api.describe().await.expect("describe after the migration");
    assert!(g.revision >= revision_before, "{:?} < {revision_before:?}", g.revision);
    assert!(g.correction.is_none(), "a slot migration is no loss: {g:?}");
    for m in &members {
        assert_eq!(m.reading.len(), 2, "{m:?}");
    }
}

/// The replication offset `field` in node `i`'s `INFO replication`.
async fn repl_offset(cluster: &RedisCluster, i: usize, field: &str) -> u64 {
    let info = cluster.node(i).server().info("replication").await;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {info}"))
}

/// Sends `signal` (`STOP`, `CONT`) to node `i`'s process.
fn signal(cluster: &RedisCluster, i: usize, signal: &str) {
    let pid = cluster.node(i).server().pid().expect("node running");
    let ok = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

/// Resumes a stopped node however the test ends.
struct Resume<'a>(&'a RedisCluster, usize);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        if self.0.node(self.1).server().is_running() {
            signal(self.0, self.1, "CONT");
        }
    }
}

/// Cuts `replica` off its master `x` so that what `x` writes next is lost with it: waits until the replica caught
/// up, stops it, then writes on `x` more than the kernel can buffer for the stopped replica. Stopping alone is not
/// enough (X's stream would wait in the replica's socket buffer and be applied after SIGCONT); loopback TCP
/// buffers are at most tcp_rmem + tcp_wmem, 36 MB here, so what follows stays in X's own output buffer and dies
/// with X. The replica runs again when the returned guard is dropped.
async fn cut_off(cluster: &RedisCluster, x: usize, replica: usize) -> Resume<'_> {
    wait_for(DEADLINE, "the replica to catch up", || async {
        let master = repl_offset(cluster, x, "master_repl_offset").await;
        (repl_offset(cluster, replica, "slave_repl_offset").await >= master).then_some(())
    })
    .await;
    signal(cluster, replica, "STOP");
    let resume = Resume(cluster, replica);
    let mut on_x = cluster.node(x).server().connection().await;
    let junk = "x".repeat(JUNK_VALUE_BYTES);
    let keys = (0..).map(|i| format!("junk-{i}")).filter(|k| initial_master_of(k) == x);
    for key in keys.take(JUNK_VALUES) {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&junk)
            .query_async(&mut on_x)
            .await
            .expect("junk written on X");
    }
    resume
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_failover_opens_the_correction_round_of_the_groups_on_that_master_only() {
    init_tracing();
    let cluster = RedisCluster::start_with_replicas().await;
    let coord = Coord::start(&target(&cluster)).await;
    let placed = groups_on_every_master(1);
    let (a_group, x) = placed[0].clone();
    let (b_group, y) = placed[1].clone();
    assert_ne!(x, y);
    let replica = x + 3;
    let (api_a, api_b) = (group_api(&coord, &a_group), group_api(&coord, &b_group));
    api_a.create(SHARDS).await.expect("A created");
    api_b.create(SHARDS).await.expect("B created");
    let mut a = vec![WireMember::new("a")];
    let mut b = vec![WireMember::new("b")];
    settle(&api_a, &mut a).await;
    settle(&api_b, &mut b).await;
    let mut a = a.remove(0);
    let stored_before = api_a.describe().await.expect("describe A").metadata_version;
    // B's member beats all along: the failover of A's master takes longer than a lease on a loaded machine.
    let (stop_b, stop) = watch::channel(false);
    let (b_log, b_task) = heartbeat_in_background(api_b.clone(), b, stop);
    wait_oks(&b_log, 1, 2, "B's heartbeats before the cut").await;

    // The replica misses what follows: c's join is written on X only, then X dies.
    let resume = cut_off(&cluster, x, replica).await;
    let mut c = WireMember::new("c");
    let joined = c.ok(&api_a).await;
    assert_eq!(joined.status, Status::Ok, "{joined:?}");
    assert!(c.version > stored_before, "c's join wrote a new version");
    cluster.kill(x);
    drop(resume);
    cluster.takeover(replica).await;
    let promoted = Instant::now();

    let round = wait_for(DEADLINE, "A's correction round to open", || async {
        api_a
            .describe()
            .await
            .ok()
            .and_then(|g| g.correction.map(|r| (g.metadata_version, r)))
    })
    .await;
    let round_after = promoted.elapsed();
    assert!(
        round.0 >= stored_before && round.0 < c.version,
        "the promoted replica holds a version before c's join: {:?} (before {stored_before:?}, c saw {:?})",
        round.0,
        c.version
    );
    let answer = a.ok_retrying(&api_a).await;
    let first_answer_after = promoted.elapsed();
    assert!(
        matches!(answer.status, Status::RevokePending | Status::SyncMetadata),
        "a member of A is in the round: {answer:?}"
    );
    let c_answer = api_a.heartbeat(&c.request(RevokeState::Revoked)).await;

    // B's master was not touched: no round, its member kept getting OK through the failover and after it.
    wait_oks(&b_log, 1, 5, "B's heartbeats after the promotion").await;
    let _ = stop_b.send(true);
    b_task.await.expect("B's heartbeat task");
    let (b_gap, b_refusals) = only_ok_or_retryable(&b_log.lock().unwrap(), 1);
    let g_b = api_b.describe().await.expect("describe B");
    assert!(g_b.correction.is_none(), "B is on another master: {g_b:?}");
    println!(
        "takeover of node {x} by {replica}: A's round visible {round_after:?} after the promotion (stored version \
         {:?}, c had seen {:?}); a's first answer {:?} after {first_answer_after:?}; c got {:?}; B (node {y}) \
         stayed OK without a round (longest gap between its OK answers {b_gap:?}, {b_refusals} retryable \
         refusals)",
        round.0,
        c.version,
        answer.status,
        c_answer.map(|r| r.status).map_err(|(code, body)| (code, body.status))
    );
}

/// Issue 30, the Cluster variant of a lost growth: only the master holding the stream's routing fails over (a
/// `TAKEOVER` by a replica that missed the growth's commit, and with it shard 0's seal, which shares the routing's
/// slot), while the other shards' records and seals live on the other masters and survive. The tick restores the
/// whole growth under a version it never issued: the surviving children's records name the growth's shard count
/// (`bornCount`), so the children whose records were on that master too get theirs again. A producer's report of
/// the lost version and count then finds nothing more to restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_of_the_routing_master_that_loses_a_growth_restores_it_from_the_other_masters() {
    init_tracing();
    let cluster = RedisCluster::start_with_replicas().await;
    // A stream whose routing is on one master while shard 4's record (the tick's probe beyond the routing) is on
    // another. Shard 0 shares the routing's slot by construction (`keys::shard_slot`), so its fence is lost with it.
    let (stream, x) = (0..)
        .map(|i| StreamName::new(format!("orders{i}")).unwrap())
        .find_map(|s| {
            let x = initial_master_of(&keys::stream_routing(&s));
            (initial_master_of(&keys::shard_fence(&s, ShardId(SHARDS))) != x).then_some((s, x))
        })
        .unwrap();
    let replica = x + 3;
    let coord = Coord::start(&target(&cluster)).await;
    let api = GroupApi {
        api: coord.api(),
        stream: stream.to_string(),
        group: "g".into(),
    };
    api.create(SHARDS).await.expect("created");
    // What X writes next (the growth's commit, shard 0's seal) dies with X.
    let resume = cut_off(&cluster, x, replica).await;
    let grown = coord
        .coordinator()
        .add_shards(&stream, SHARDS, None)
        .await
        .expect("grown");
    assert_eq!(grown.shard_count, 2 * SHARDS);
    cluster.kill(x);
    drop(resume);
    cluster.takeover(replica).await;
    let promoted = Instant::now();

    // The tick restores the whole growth from the surviving records, also past a child whose record was on X.
    let lost_records = (SHARDS..2 * SHARDS)
        .filter(|&n| initial_master_of(&keys::shard_fence(&stream, ShardId(n))) == x)
        .count();
    let by_tick = wait_for(DEADLINE, "the growth restored from the records", || async {
        let r = coord.coordinator().describe_routing(&stream).await.ok();
        r.filter(|r| r.shard_count > SHARDS)
    })
    .await;
    let restored_after = promoted.elapsed();
    assert_eq!(by_tick.shard_count, 2 * SHARDS, "the growth the records name, whole");
    assert!(
        by_tick.routing_version > grown.routing_version,
        "the lost number is retired: {} after {}",
        by_tick.routing_version,
        grown.routing_version
    );
    // A producer that learned the lost growth reports it: nothing is left to restore, the answer is the restored
    // routing.
    let answer = coord
        .coordinator()
        .routing(
            &stream,
            protocol::messages::RoutingQuery {
                routing_version: grown.routing_version,
                max_observed_version: grown.routing_version,
                max_shard_count: 2 * SHARDS,
            },
        )
        .await
        .expect("routing fetch");
    assert_eq!(answer.status, Status::Ok, "{answer:?}");
    assert_eq!(answer.shard_count, 2 * SHARDS, "{answer:?}");
    assert_eq!(answer.routing_version, by_tick.routing_version, "{answer:?}");
    let restored = coord.coordinator().describe_routing(&stream).await.expect("describe");
    assert_eq!((restored.shard_count, restored.shards_beyond_routing), (2 * SHARDS, 0));
    println!(
        "takeover of the routing's master {x} by {replica}: growth {SHARDS} -> {} lost ({lost_records} children's \
         records with it); the tick restored {} shards {restored_after:?} after the promotion at version {}; after \
         a producer's report: {} at {} (the lost version was {})",
        2 * SHARDS,
        by_tick.shard_count,
        by_tick.routing_version,
        restored.shard_count,
        restored.routing_version,
        grown.routing_version
    );
}
