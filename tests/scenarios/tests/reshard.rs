//! Growing a stream under keyed load without breaking per-key order (issue 16, `docs/resharding.md`): the
//! coordinator seals every old shard at add-shards, and each group reads the new shards (children) only once it
//! drained every old one (parent) up to its seal.
//!
//! Three consumer groups of two consumers each read a stream that grows 4 -> 8 -> 16 shards while producers write
//! keyed records. Per group, the checker asserts per-key order *across shards* (the first delivery of every record
//! of a key comes after the first delivery of the key's previous record, wherever the key was routed), on top of
//! the usual rules of `scenario_tests::History` (one reader per shard, nothing acknowledged lost).
//!
//! * `growth_4_8_16_under_keyed_load_keeps_per_key_order`: producers that learn of each growth at once (the test
//!   pauses them across the add-shards call and hints the new version, as an operator tool would), so no write
//!   with an old routing lands after a seal;
//! * `growth_with_a_stale_producer_keeps_per_key_order`: the same, without the pause, plus a producer whose routing
//!   refresh is effectively off (a 10-minute routing lease) until the data-plane fence refuses it: this needs the
//!   fenced publish script of the producer (issue 16 item 1);
//! * `a_coordinator_killed_while_recording_drains_releases_nothing_early`: the coordinator dies in the section
//!   that records the first drained parent; another one finishes the reshard;
//! * `a_failover_that_loses_drains_and_a_fence_holds_the_children_again`: Redis fails over to a replica that
//!   missed the drain records and a fence (a correction round); the new coordinator seals again and observes
//!   again before any child is read;
//! * `a_failover_that_loses_a_growth_producers_routed_by_strands_nothing` (issue 30, issue 39): Redis fails over
//!   to a replica that never received the growth while producers route by it; the children refuse them, their
//!   report is not evidence (Redis kept nothing of the growth), they re-route by the stored routing, and every
//!   acknowledged record is read in per-key order.

mod common;
#[path = "reshard_parts/rig.rs"]
mod rig;

use common::*;
use coord_server::fault::{Action, Point};
use coord_server::server::CoordinatorHandle;
use coord_server::state_machine::Event;
use protocol::keys;
use protocol::messages::CreateGroupRequest;
use protocol::metadata::GroupMetadata;
use protocol::names::GroupName;
use protocol::{RoutingVersion, ShardId};
use rig::*;
use scenario_tests::History;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stream_consumer::ConsumerHandle;
use stream_producer::Producer;
use test_support::{FaultProxy, Mode, RedisServer, ReplicaPair};
use tokio::sync::RwLock;

/// The 4 -> 8 -> 16 growth. `pause`: hold the hinted producers across each add-shards call (no stale write can
/// exist then); `stale`: add a producer that is never hinted.
async fn grow_4_8_16(name: &str, pause: bool, stale: bool) {
    let g = Grow::start(name, 4).await;
    let producers = vec![g.producer().await, g.producer().await];
    let mut load = Load::new();
    for (i, p) in producers.iter().enumerate() {
        load.spawn(
            Arc::clone(p),
            &format!("p{i}"),
            &g.histories,
            Duration::from_millis(1),
            true,
        );
    }
    let stale_producer = if stale {
        // Its own version store: the producers of one process share what they observed, and this one must not
        // learn of a growth from the hinted ones.
        let p =
            g.s.producer()
                .redis(g.client_redis.clone())
                .version_store(client_core::MemoryVersionStore::new())
                .build()
                .expect("producer configuration");
        p.ready().await.expect("producer ready");
        let p = Arc::new(p);
        load.spawn(Arc::clone(&p), "stale", &g.histories, Duration::from_millis(1), false);
        Some(p)
    } else {
        None
    };
    // A backlog in the parents before the growth.
    load.wait_written(BACKLOG).await;

    let mut waits = Vec::new();
    for (count, shards) in [(4, 8), (8, 16)] {
        let before = g.children_wait(&g.s.coord().url()).await;
        let guard = if pause { Some(load.pause().await) } else { None };
        let version = g.add_shards(count).await;
        hint(&producers, version).await;
        drop(guard);
        g.wait_released(shards, DEADLINE).await;
        let after = g.children_wait(&g.s.coord().url()).await;
        let per_group: Vec<f64> = after
            .iter()
            .zip(&before)
            .map(|(a, b)| {
                assert_eq!(a.1, b.1 + 1, "one release per group and growth");
                a.0 - b.0
            })
            .collect();
        println!(
            "children wait {}->{shards} per group (s): {per_group:?}",
            shards - count
        );
        waits.push(per_group);
        load.wait_written(BACKLOG).await;
    }
    if let Some(p) = &stale_producer {
        // Without a fence it would still route with 4 shards: its keys would never move and their order would
        // hold trivially. Its lease runs out at last: it refreshes, its keys move to children that are already
        // read, while what it wrote into the parents after their seals is still unread there. The fence must
        // have refused those writes long before.
        let v =
            g.s.coordinator()
                .describe_routing(&g.s.stream)
                .await
                .expect("routing")
                .routing_version;
        hint(std::slice::from_ref(p), v).await;
        load.wait_written(BACKLOG).await;
    }
    let (written, refused) = load.stop().await;
    println!("written {written}, not written (retried) {refused}, waits {waits:?}");
    let figures = g.check(Duration::from_secs(30)).await;
    println!("figures {figures:?}");
    if let Some(p) = stale_producer {
        assert_eq!(
            p.routing().map(|r| r.shard_count),
            Some(16),
            "the stale producer was refused into refreshing"
        );
    }
    assert!(figures.iter().all(|f| f.keys_moved > 0), "keys moved to children");
    for m in 0..GROUPS {
        let meta = g.metadata(&g.groups[m]).await;
        assert_eq!(meta.shard_count, 16);
    }
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn growth_4_8_16_under_keyed_load_keeps_per_key_order() {
    grow_4_8_16("grow", true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn growth_with_a_stale_producer_keeps_per_key_order() {
    grow_4_8_16("stale", false, true).await;
}

/// The first group's consumers are held inside their handler, so its parents cannot drain; the coordinator then
/// dies in the section that records the first drain of the other groups (or of this one once released). A new
/// coordinator on the same Redis finishes the reshard, and no group read a child before its parents.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_coordinator_killed_while_recording_drains_releases_nothing_early() {
    let mut g = Grow::start("killed", 4).await;
    let producers = vec![g.producer().await];
    let mut load = Load::new();
    load.spawn(
        Arc::clone(&producers[0]),
        "p0",
        &g.histories,
        Duration::from_millis(2),
        true,
    );
    load.wait_written(BACKLOG).await;

    let hang = Trigger::once(g.s.coordinator(), Point::BeforeWrite, Action::Hang, |t| {
        on::event(t, |e| matches!(e, Event::ParentDrained { .. }))
    });
    let guard = load.pause().await;
    let version = g.add_shards(4).await;
    hint(&producers, version).await;
    drop(guard);
    hang.fired().await;
    // Dead in the middle: the drain it decided is not recorded, its mutex is left to expire.
    g.s.coords[0].abort();
    let mut adopted = 0;
    for m in &g.groups {
        // A group not ticked yet before the crash is still at 4 shards; one that adopted holds its children.
        let meta = g.metadata(m).await;
        assert!(
            meta.shard_count == 4 || !meta.reshards.is_empty(),
            "{m}: released by the dead coordinator"
        );
        adopted += usize::from(meta.shard_count == 8);
    }
    assert!(adopted >= 1, "the crash came after an adoption");
    // Writes go on while no coordinator runs.
    load.wait_written(BACKLOG / 4).await;
    g.s.coords[0].restart().await;
    g.wait_released(8, DEADLINE).await;
    // And into the released children.
    load.wait_written(BACKLOG / 2).await;
    let (written, _) = load.stop().await;
    let figures = g.check(Duration::from_secs(30)).await;
    println!("written {written}, figures {figures:?}");
    g.stop().await;
}

/// Redis fails over in the middle of a reshard. The cut: the replica has the growth, the groups' adoption and
/// the children's records, but not what the old primary recorded next: the drains, the release, and the reads of
/// the children (and, as a stand-in for a lost seal, one parent's fence is removed on the replica). The coordinator
/// on the promoted replica seals that parent again and observes the drains again before any child is read there;
/// every record is handled and per-key order holds across the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_that_loses_drains_and_a_fence_holds_the_children_again() {
    init_tracing();
    let ReplicaPair { primary, replica } = ReplicaPair::start().await;
    let replica_addr = SocketAddr::from(([127, 0, 0, 1], replica.port()));
    let front = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], primary.port()))).await;
    let mut g = Grow::on(primary, "failover", 4, front.url()).await;
    let producers = vec![g.producer().await];
    let mut load = Load::new();
    load.spawn(
        Arc::clone(&producers[0]),
        "p0",
        &g.histories,
        Duration::from_millis(2),
        true,
    );
    load.wait_written(BACKLOG).await;

    // The growth; the coordinator dies in the first section that would record a drain, so the children stay
    // held while the load fills them.
    let hang = Trigger::once(g.s.coordinator(), Point::BeforeWrite, Action::Hang, |t| {
        on::event(t, |e| matches!(e, Event::ParentDrained { .. }))
    });
    let guard = load.pause().await;
    let version = g.add_shards(4).await;
    hint(&producers, version).await;
    drop(guard);
    hang.fired().await;
    g.s.coords[0].abort();
    load.wait_written(BACKLOG / 2).await;

    // The cut: everything so far is on the replica, then it is promoted (the load is held from here to the end of
    // the failover, so no acknowledged record is lost with the primary).
    let guard = load.pause().await;
    test_support::wait_replicated(&g.s.redis).await;
    replica.promote().await;
    let mut rcon = replica.connection().await;
    let _: i64 = redis::cmd("DEL")
        .arg(keys::shard_fence(&g.s.stream, ShardId(1)))
        .query_async(&mut rcon)
        .await
        .expect("DEL fence");

    // On the old primary only: a coordinator records the drains and releases the children; consumers read them.
    g.s.coords[0].restart().await;
    g.wait_released(8, DEADLINE).await;
    for h in &g.histories {
        wait_all_handled(h, DEADLINE).await;
    }

    // The primary dies with its coordinator; clients and a new coordinator move to the promoted replica.
    let mut undrained = 0;
    for m in &g.groups {
        // Not adopted yet, or adopted with its children held: never released on the replica.
        let meta = metadata_on(&replica, &g.s.stream, m).await;
        assert!(
            meta.shard_count == 4 || !meta.reshards.is_empty(),
            "{m}: the replica never saw a release"
        );
        undrained += reshard_parents_not_drained(&meta);
    }
    assert!(undrained > 0, "the replica lost drains the old primary recorded");
    g.s.redis.kill();
    g.s.coords[0].abort();
    let _old = std::mem::replace(&mut g.s.redis, replica);
    front.set_target(replica_addr);
    front.set_mode(Mode::Reset);
    front.set_mode(Mode::Pass);
    g.s.coords[0].restart_on(&g.s.redis.url()).await;
    g.wait_released(8, DEADLINE).await;
    let mut con = g.s.redis.connection().await;
    let fence: Option<String> = redis::cmd("HGET")
        .arg(keys::shard_fence(&g.s.stream, ShardId(1)))
        .arg(keys::shard_fence_fields::ROUTING_VERSION)
        .query_async(&mut con)
        .await
        .expect("HGET fence");
    assert_eq!(fence, Some(version.0.to_string()), "the lost fence was set again");
    drop(guard);
    load.wait_written(BACKLOG).await;
    let (written, _) = load.stop().await;
    let figures = g.check(Duration::from_secs(30)).await;
    println!("written {written}, figures {figures:?}");
    g.stop().await;
}

/// Issue 30: Redis fails over to a replica that never received a growth (4 -> 8) which every producer already
/// routes by. Before the fix producers kept writing to the children (the plain fence treated a missing fence as 0
/// and `XADD` created the shard): acknowledged records no group read, 420-778 per run. Now a child without its
/// record refuses them, and their refresh reports version and shard count; since issue 39 that report is a hint,
/// not evidence: Redis kept nothing of the growth, so the producers re-route by the stored 4 shards. Checked per group: every acknowledged record read, no per-key inversion across shards,
/// one reader per shard. The load is held across the replication cut and the switch, so Redis itself loses no
/// acknowledged record in this run (counted: `lost_by_redis`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_that_loses_a_growth_producers_routed_by_strands_nothing() {
    init_tracing();
    let ReplicaPair { primary, replica } = ReplicaPair::start().await;
    let replica_addr = SocketAddr::from(([127, 0, 0, 1], replica.port()));
    let front = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], primary.port()))).await;
    let mut g = Grow::on(primary, "lostgrowth", 4, front.url()).await;
    let producers = vec![g.producer().await, g.producer().await];
    let mut load = Load::new();
    for (i, p) in producers.iter().enumerate() {
        load.spawn(
            Arc::clone(p),
            &format!("p{i}"),
            &g.histories,
            Duration::from_millis(2),
            true,
        );
    }
    load.wait_written(BACKLOG).await;

    // The cut: the replica has everything written so far, then stops replicating.
    let guard = load.pause().await;
    test_support::wait_replicated(&g.s.redis).await;
    replica.promote().await;
    // On the old primary only: the growth, which every producer learns.
    let lost_version = g.add_shards(4).await;
    hint(&producers, lost_version).await;
    for p in &producers {
        assert_eq!(p.routing().map(|r| r.shard_count), Some(8));
    }
    // The failover: the old primary dies, clients and the coordinator move to the promoted replica.
    g.s.redis.kill();
    g.s.coords[0].abort();
    let _old = std::mem::replace(&mut g.s.redis, replica);
    front.set_target(replica_addr);
    front.set_mode(Mode::Reset);
    front.set_mode(Mode::Pass);
    g.s.coords[0].restart_on(&g.s.redis.url()).await;
    let lost = g.s.coordinator().describe_routing(&g.s.stream).await.expect("routing");
    assert_eq!(lost.shard_count, 4, "the replica never saw the growth");
    // Held from the cut to here: no acknowledged record was written to the old primary alone.
    let lost_by_redis = 0;
    drop(guard);

    // The producers write on with the lost routing: refused by the children (no record), their refresh reports
    // the lost version and shard count, and a report is never evidence (issue 39): Redis holds nothing of the
    // growth (no record, no fence, no entry in a child), so the coordinator answers the stored routing and the
    // producers re-route by it. Nothing was written to a child, so nothing is stranded.
    wait_routing_count(&producers, 4).await;
    let stored = g.s.coordinator().describe_routing(&g.s.stream).await.expect("routing");
    assert_eq!(stored.shard_count, 4, "a report alone grows nothing");
    load.wait_written(BACKLOG).await;
    let (written, refused) = load.stop().await;
    let figures = g.check(Duration::from_secs(30)).await;
    println!(
        "lost growth: written {written}, refused and sent again {refused}, lost by Redis {lost_by_redis}, \
         stranded 0 (every group read every acknowledged record), figures {figures:?}"
    );
    assert!(
        refused > 0,
        "the lost children refused the producers that routed by them"
    );
    g.stop().await;
}

/// Waits until every producer routes by `count` shards.
async fn wait_routing_count(producers: &[Arc<stream_producer::Producer>], count: u32) {
    for p in producers {
        test_support::wait_until(DEADLINE, "the producer routes by the stored count", || {
            let routing = p.routing();
            async move { routing.is_some_and(|r| r.shard_count == count) }
        })
        .await;
    }
}

/// Issue 30: as [`a_failover_that_loses_a_growth_producers_routed_by_strands_nothing`], with the loss an
/// operator's restore of every key from a snapshot taken before the growth, the server started again from it (new
/// run id): the
/// routing, the fences and records, the groups' metadata and the streams go back; producers and consumers remember
/// the growth. The load is held from the snapshot to the restore, so Redis loses no acknowledged record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_restore_from_before_a_growth_strands_nothing() {
    init_tracing();
    let redis = RedisServer::builder().persistence(true).start().await;
    let url = redis.url();
    let mut g = Grow::on(redis, "snapgrowth", 4, url).await;
    let producers = vec![g.producer().await, g.producer().await];
    let mut load = Load::new();
    for (i, p) in producers.iter().enumerate() {
        load.spawn(
            Arc::clone(p),
            &format!("p{i}"),
            &g.histories,
            Duration::from_millis(2),
            true,
        );
    }
    load.wait_written(BACKLOG).await;
    let guard = load.pause().await;
    let snapshot = g.s.redis.snapshot_keys("*").await;
    let lost_version = g.add_shards(4).await;
    hint(&producers, lost_version).await;
    // The groups adopt the growth (their members see version and shards), then the restore takes it back.
    for m in &g.groups {
        let g = &g;
        test_support::wait_until(DEADLINE, "the group adopts the growth", || async move {
            g.metadata(m).await.shard_count == 8
        })
        .await;
    }
    g.s.redis.restore_snapshot(&snapshot).await;
    assert_eq!(
        g.s.coordinator()
            .describe_routing(&g.s.stream)
            .await
            .expect("routing")
            .shard_count,
        4,
        "restored to before the growth"
    );
    // The operator's restore starts the server again from the snapshot: another run id. (A restore into the running
    // server, same run id, is indistinguishable from a routing nobody grew: reports are then not believed and the
    // restored routing stands, see docs/resharding.md.)
    g.s.redis.restart().await;
    drop(guard);

    // Nothing in Redis tells of the growth any more (its records, fences and children went back too): the
    // producers' and consumers' reports are hints, never evidence (issue 39), so the stream stays at 4 shards and
    // the producers re-route by it; the lost version number is retired by the next growth, never reused.
    wait_routing_count(&producers, 4).await;
    let stored = g.s.coordinator().describe_routing(&g.s.stream).await.expect("routing");
    assert_eq!(stored.shard_count, 4, "a report alone grows nothing");
    load.wait_written(BACKLOG).await;
    let (written, refused) = load.stop().await;
    let figures = g.check(Duration::from_secs(30)).await;
    println!(
        "snapshot restore: written {written}, refused and sent again {refused}, lost by Redis 0 (held), stranded 0, \
         figures {figures:?}"
    );
    g.stop().await;
}

/// Issue 30, defect 4 of the routing model check, with real processes: an operator restores a snapshot into the
/// running server (same run id), so nothing tells the coordinator a growth was lost, and the next add-shards issues
/// the lost version number again with another shard count. A producer still holding the lost layout (v2, 8 shards)
/// must not write a key into the shard that layout gives it when the new layout (v2, 12 shards) moved the key:
/// the parent's record names 12 shards (`fenceCount`), so the write is refused (`Fenced`, not written), and the
/// producer's next send routes by the layout Redis stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_into_the_running_server_reissues_a_version_but_no_write_follows_the_lost_layout() {
    let g = Grow::start("inplace", 4).await;
    let stale = g.producer().await;
    let snapshot = g.s.redis.snapshot_keys("*").await;
    let lost = g.add_shards(4).await;
    hint(std::slice::from_ref(&stale), lost).await;
    assert_eq!(stale.routing().map(|r| r.shard_count), Some(8));
    // Every group done with the growth first: a drain observation still in flight at the restore would seal a
    // parent again after it, which tells the coordinator of the loss (it then retires the number instead).
    g.wait_released(8, DEADLINE).await;
    g.s.redis.restore_snapshot(&snapshot).await;
    let again = g.add_shards(8).await;
    assert_eq!(
        again, lost,
        "nothing told the coordinator the number was lost: it is issued again"
    );
    let stored = g.s.coordinator().describe_routing(&g.s.stream).await.expect("routing");
    assert_eq!(stored.shard_count, 12);
    // A key the lost layout keeps on a parent that the stored layout moves to a child.
    let (key, parent, child) = (0..10_000)
        .map(|i| format!("k{i}"))
        .find_map(|k| {
            let (old, new) = (
                protocol::routing::shard_for_key(k.as_bytes(), 8).0,
                protocol::routing::shard_for_key(k.as_bytes(), 12).0,
            );
            (old < 4 && new >= 8).then_some((k, old, new))
        })
        .expect("a key that moved");
    let first = stale.send(&key, &[("n", "first")]).await;
    let second = stale
        .send(&key, &[("n", "second")])
        .await
        .expect("the second send is written");
    assert_eq!(second.shard.0, child, "routed by the stored layout: {second:?}");
    match &first {
        Ok(p) => assert_eq!(p.shard.0, child, "re-routed, not written by the lost layout: {p:?}"),
        Err(e) => assert!(e.is_fenced(), "refused as Fenced, not written: {e}"),
    }
    let mut con = g.s.redis.connection().await;
    let on_parent: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(keys::shard_stream(&g.s.stream, ShardId(parent)))
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .expect("XRANGE");
    assert!(
        on_parent
            .iter()
            .all(|(_, fields)| fields.iter().all(|(_, v)| v != "first" && v != "second")),
        "nothing of {key} on parent {parent} (the lost layout's shard)"
    );
    println!(
        "in-place restore: v{} issued again with 12 shards (lost: 8); {key} (lost layout: shard {parent}, stored: \
         shard {child}): first send {}, second written to shard {}",
        again,
        match &first {
            Ok(p) => format!("written to shard {}", p.shard),
            Err(e) => format!("refused ({e})"),
        },
        second.shard
    );
    g.stop().await;
}
