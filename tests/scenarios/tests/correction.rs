//! Metadata version correction (seed scenarios 6-9): Redis falls back to an older metadata version (restored
//! snapshot of the group's keys, same Redis run id), clients that saw the newer one are brought back to the
//! stored version, drain what it does not give them, and start again only on `OK`.

mod common;

use common::*;
use coord_server::fault::{Action, Point};
use protocol::messages::{HeartbeatResponse, RevokeState};
use protocol::{ShardId, Status};
use scenario_tests::History;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sends `m`'s heartbeats (reporting revoking shards as `state`) until an answer has status `want`; returns the
/// statuses seen on the way.
async fn beat_until(
    api: &GroupApi,
    m: &mut WireMember,
    state: RevokeState,
    want: Status,
) -> (Vec<Status>, HeartbeatResponse) {
    let what = format!("{} to get {want}", m.id);
    let state_of = tokio::sync::Mutex::new((m, Vec::new()));
    let r = test_support::wait_for(DEADLINE, &what, || async {
        let mut guard = state_of.lock().await;
        let (m, seen) = &mut *guard;
        let r = m.beat(api, state).await.unwrap_or_else(|e| panic!("{}: {e:?}", m.id));
        seen.push(r.status);
        (r.status == want).then_some(r)
    })
    .await;
    (state_of.into_inner().1, r)
}

// ---- level 2 ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed6_client_at_version_n_after_redis_fell_back_to_n_minus_1_gets_sync_metadata_for_n_minus_1() {
    let s = Scenario::start("s6", 4).await;
    let api = s.api();
    let mut a = WireMember::new("a");
    a.ok(&api).await;
    let snap = s.redis.snapshot_keys(&s.group_state_pattern()).await;
    let n_minus_1 = s.describe().await.metadata_version;
    let mut b = WireMember::new("b");
    b.ok(&api).await;
    a.ok(&api).await;
    let n = a.version;
    assert!(n > n_minus_1);

    s.redis.restore_snapshot(&snap).await;
    let r = a.ok(&api).await;
    assert_eq!(r.status, Status::SyncMetadata, "{r:?}");
    assert_eq!(
        r.metadata_version, n_minus_1,
        "the answer carries the stored, older version"
    );
    assert_eq!(a.max_observed, n, "the client keeps the highest version it saw");
    let g = s.describe().await;
    assert_eq!(g.metadata_version, n_minus_1, "Redis is not bumped to match the client");
    assert!(g.correction.is_some());
    let metrics = s.coord().api().metrics().await;
    assert!(
        metric(&metrics, "redis_stream_coord_client_version_ahead_total") >= 1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed7_lost_sync_metadata_answer_is_repeated_for_the_next_high_version_heartbeat() {
    let s = Scenario::start("s7", 4).await;
    let api = s.api();
    let mut a = WireMember::new("a");
    a.ok(&api).await;
    let snap = s.redis.snapshot_keys(&s.group_state_pattern()).await;
    let n_minus_1 = s.describe().await.metadata_version;
    WireMember::new("b").ok(&api).await;
    a.ok(&api).await;
    s.redis.restore_snapshot(&snap).await;

    // a's high-version heartbeat is handled (the round is opened, by it or by the coordinator's own check, and
    // a's lease renewed), and its SYNC_METADATA answer is lost.
    let lose = Trigger::once(s.coordinator(), Point::AfterWrite, Action::Fail, on::renews("a"));
    let req = a.request(RevokeState::Revoked);
    let lost = api.heartbeat(&req).await;
    assert_eq!(lose.count(), 1);
    assert!(lost.is_err(), "{lost:?}");
    let first = api.hb(&req).await;
    assert_eq!(
        (first.status, first.metadata_version),
        (Status::SyncMetadata, n_minus_1)
    );
    let second = api.hb(&req).await;
    assert_eq!(
        second, first,
        "the same high-version heartbeat gets the same SYNC_METADATA"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed8_sync_metadata_then_revoke_pending_until_revoked_and_unblocked_then_ok() {
    let s = Scenario::start("s8", 4).await;
    let api = s.api();
    let (mut a, mut b) = (WireMember::new("a"), WireMember::new("b"));
    a.ok(&api).await;
    b.ok(&api).await;
    for _ in 0..3 {
        a.ok(&api).await;
        b.ok(&api).await;
    }
    assert_eq!((a.reading.len(), b.reading.len()), (2, 2));
    // N-1: a and b own two shards each.
    let snap = s.redis.snapshot_keys(&s.group_state_pattern()).await;
    let n_minus_1 = s.describe().await.metadata_version;
    let kept = a.reading.clone();
    // N: b left, a reads all four.
    b.epoch = protocol::MemberEpoch::LEAVE;
    s.api().hb(&b.request(RevokeState::Revoked)).await;
    a.ok(&api).await;
    assert_eq!(a.reading.len(), 4);

    s.redis.restore_snapshot(&snap).await;
    // SYNC_METADATA: a keeps the shards the stored version gives it and drains b's.
    let r = a.beat(&api, RevokeState::Draining).await.unwrap();
    assert_eq!(
        (r.status, r.metadata_version),
        (Status::SyncMetadata, n_minus_1),
        "{r:?}"
    );
    assert_eq!(a.reading, kept);
    let removed: BTreeSet<ShardId> = a.revoking.clone();
    assert_eq!(removed.len(), 2);
    // Still draining: REVOKE_PENDING, for longer than a member TTL (its claim on b's shards blocks the round).
    let until = Instant::now() + TTL + Duration::from_millis(300);
    while Instant::now() < until {
        let r = a.beat(&api, RevokeState::Draining).await.unwrap();
        assert_eq!(r.status, Status::RevokePending, "{r:?}");
        assert_eq!(a.reading, kept, "nothing new starts");
        // Real time: the claim must hold for longer than a member TTL on the coordinator's clock (Redis TIME).
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // REVOKED: still REVOKE_PENDING until b (recorded as owner, gone) no longer blocks a's targets, then OK.
    let (seen, ok) = beat_until(&api, &mut a, RevokeState::Revoked, Status::Ok).await;
    assert!(seen.iter().all(|st| *st != Status::SyncMetadata), "{seen:?}");
    assert!(ok.metadata_version > n_minus_1, "{ok:?}");
    let g = s.describe().await;
    assert!(member(&g, "b").is_none(), "b expired: {g:#?}");
    assert_eq!(a.reading.len(), 4, "a got everything with OK: {ok:?}");
    assert_no_split(&g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed9_concurrent_stale_revokes_in_a_round_apply_only_where_redis_ownership_matches() {
    let s = Scenario::start("s9", 6).await;
    let api = s.api();
    let (mut a, mut c) = (WireMember::new("a"), WireMember::new("c"));
    a.ok(&api).await;
    c.ok(&api).await;
    a.beat(&api, RevokeState::Draining).await.unwrap();
    // N-1: a owns all six, three of them targeted to c (moving).
    let snap = s.redis.snapshot_keys(&s.group_state_pattern()).await;
    let moving: BTreeSet<ShardId> = a.revoking.clone();
    assert_eq!(moving.len(), 3);
    // N: a released them, c reads them.
    a.ok(&api).await;
    c.ok(&api).await;
    assert_eq!(c.reading, moving);

    s.redis.restore_snapshot(&snap).await;
    // Both report every shard they gave up or read as REVOKED, at the same time: a's acks for shards Redis
    // records as a's and targets elsewhere match; a's acks for shards targeted to itself, and c's acks for
    // shards Redis records as a's, do not.
    let all: Vec<ShardId> = (0..6).map(ShardId).collect();
    let mut ra = a.request(RevokeState::Revoked);
    ra.revoking = all
        .iter()
        .map(|&shard| protocol::messages::RevokingShard {
            shard,
            state: RevokeState::Revoked,
        })
        .collect();
    ra.owned.clear();
    let mut rc = c.request(RevokeState::Revoked);
    rc.revoking = moving
        .iter()
        .map(|&shard| protocol::messages::RevokingShard {
            shard,
            state: RevokeState::Revoked,
        })
        .collect();
    rc.owned.clear();
    let (xa, xc) = tokio::join!(api.heartbeat(&ra), api.heartbeat(&rc));
    let (xa, xc) = (xa.unwrap(), xc.unwrap());
    assert_eq!((xa.status, xc.status), (Status::SyncMetadata, Status::SyncMetadata));

    let g = s.describe().await;
    for shard in &g.shards {
        let target = shard.target.as_ref().map(|m| m.as_str());
        let owner = shard.owner.as_ref().map(|m| m.as_str());
        if moving.contains(&shard.shard) {
            assert_eq!(
                (target, owner),
                (Some("c"), Some("c")),
                "a's matching ack released it to c: {g:#?}"
            );
        } else {
            assert_eq!(
                (target, owner),
                (Some("a"), Some("a")),
                "a's ack of its own target is ignored: {g:#?}"
            );
        }
    }
    assert_no_split(&g);
    assert!(g.correction.is_some(), "still in the round");
}

// ---- level 3 ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed6_8_9_consumers_after_a_rollback_resync_drain_concurrently_and_resume_with_no_split() {
    let s = Scenario::start("s689e2e", 6).await;
    let history = History::new();
    let producer = Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(10), 12);
    let a = s.spawn_consumer("a", &history);
    let b = s.spawn_consumer("b", &history);
    wait_status(&a, DEADLINE, "a reads three", |st| {
        st.reading.len() == 3 && st.revoking.is_empty()
    })
    .await;
    wait_status(&b, DEADLINE, "b reads three", |st| {
        st.reading.len() == 3 && st.revoking.is_empty()
    })
    .await;
    let snap = s.redis.snapshot_keys(&s.group_state_pattern()).await;
    let n_minus_1 = s.describe().await.metadata_version;

    // N: c joins and takes two shards from a and b.
    let c = s.spawn_consumer("c", &history);
    for h in [&a, &b, &c] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    let n = s.describe().await.metadata_version;
    assert!(n > n_minus_1);

    // Redis falls back to N-1: a and b drain c's shards concurrently, c's join is lost (it rejoins).
    s.redis.restore_snapshot(&snap).await;
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "SYNC_METADATA, then OK again past N", |st| {
            st.heartbeats.sync_metadata >= 1 && st.last_status == Some(Status::Ok) && st.metadata_version > n
        })
        .await;
    }
    wait_status(&c, DEADLINE, "c to rejoin and get OK past N", |st| {
        st.heartbeats.unknown_member >= 1 && st.last_status == Some(Status::Ok) && st.metadata_version > n
    })
    .await;
    let (sa, sb) = (a.status(), b.status());
    assert!(
        sa.heartbeats.sync_metadata >= 1 && sb.heartbeats.sync_metadata >= 1,
        "{sa:?} {sb:?}"
    );
    assert!(sa.heartbeats.revoke_pending >= 1 && sb.heartbeats.revoke_pending >= 1);
    assert_eq!(sa.heartbeats.lease_expiries + sb.heartbeats.lease_expiries, 0);
    for h in [&a, &b, &c] {
        wait_status(h, DEADLINE, "two shards each again", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    let outcomes = publisher.stop().await;
    assert!(outcomes.written > 0);
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    for h in [a, b, c] {
        h.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed7_consumer_whose_sync_metadata_answer_was_lost_gets_it_again_and_converges() {
    let s = Scenario::start("s7e2e", 4).await;
    let history = History::new();
    let a = s.spawn_consumer("a", &history);
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    let snap = s.redis.snapshot_keys(&s.group_state_pattern()).await;
    let b = s.spawn_consumer("b", &history);
    wait_status(&b, DEADLINE, "b reads two", |st| st.reading.len() == 2).await;
    let n = a.status().metadata_version;

    // The first answer a's heartbeats get after the fall-back is SYNC_METADATA: lose it.
    let restored = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let after_restore = Arc::clone(&restored);
    let renews_a = on::renews("a");
    let lose = Trigger::once(s.coordinator(), Point::AfterWrite, Action::Fail, move |t| {
        after_restore.load(std::sync::atomic::Ordering::SeqCst) && renews_a(t)
    });
    s.redis.restore_snapshot(&snap).await;
    restored.store(true, std::sync::atomic::Ordering::SeqCst);
    lose.fired().await;
    wait_status(&a, DEADLINE, "a back on OK past N", |st| {
        st.last_status == Some(Status::Ok) && st.metadata_version > n
    })
    .await;
    let st = a.status();
    assert!(st.heartbeats.failed >= 1 && st.heartbeats.sync_metadata >= 1, "{st:?}");
    let producer = s.producer().build().unwrap();
    publish(&producer, &history, 0, 20, 5).await;
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_that_loses_a_release_gets_the_release_acknowledged_again_with_no_two_readers() {
    let s = Scenario::start("lostrelease", 4).await;
    let history = History::new();
    let gate = Gate::closed();
    let a = s.spawn_gated("a", &history, &gate);
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    let producer = s.producer().build().unwrap();
    publish(&producer, &history, 0, 16, 16).await;
    wait_status(&a, DEADLINE, "a holds an entry of every shard", |st| {
        st.in_flight.len() == 4
    })
    .await;

    // W1 recorded (a must drain two shards for b), a still draining: Redis will fall back to this point.
    let b = s.spawn_consumer("b", &history);
    let st = wait_status(&a, DEADLINE, "a told to drain", |st| st.revoking.len() == 2).await;
    let moved = shard_set(&st.revoking);
    let snap = s.redis.snapshot_keys(&s.group_state_pattern()).await;
    // W3: a releases, b reads them.
    gate.set(true);
    wait_status(&b, DEADLINE, "b reads the moved shards", |st| {
        shard_set(&st.reading) == moved
    })
    .await;
    wait_status(&a, DEADLINE, "a forgot them", |st| st.revoking.is_empty()).await;

    // Redis loses W3: it records a as the owner again, b as the target. a is told to drain shards it no longer
    // reads and acknowledges them at once; b's reading is either already b's again (a's ack came first) or a
    // foreign claim it drains (b's heartbeat came first). Either way nobody reads them twice, and after the
    // round b reads them under an OK.
    let ok_before = b.status().heartbeats.ok;
    s.redis.restore_snapshot(&snap).await;
    wait_status(&b, DEADLINE, "b reads them after the round", |st| {
        shard_set(&st.reading) == moved && st.last_status == Some(Status::Ok) && st.heartbeats.sync_metadata >= 1
    })
    .await;
    assert!(b.status().heartbeats.ok > ok_before);
    let st = a.status();
    assert!(shard_set(&st.reading).is_disjoint(&moved), "{st:?}");
    publish(&producer, &history, 100, 16, 16).await;
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}
