//! Coordinator outages and Redis metadata rollbacks, against a real redis-server and the real coordinator.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use stream_consumer::{FileVersionStore, Status, VersionStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_delivered_then_coordinator_down_keeps_the_shard_revoking_and_never_resumes_it() {
    let mut env = Env::start("drain-down").await;
    let rec = Recorder::new();
    let gate_a = Gate::open();
    let a = env.consumer_with("a", &rec, gate_a.clone()).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;

    // a hangs inside one entry of every shard, so a DRAIN cannot complete yet.
    gate_a.set(false);
    let mut first = BTreeSet::new();
    for shard in 0..SHARDS {
        first.insert(env.produce_one(shard, u64::from(shard)).await);
    }
    wait_status(&a, Duration::from_secs(10), "a holds an entry of every shard", |s| {
        s.in_flight.len() == 8
    })
    .await;

    let b = env.consumer("b", &rec).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a received DRAIN for 4 shards", |s| {
        s.revoking.len() == 4
    })
    .await;
    let drained = shards(&a.status().revoking);
    let kept = shards(&a.status().reading);
    let drain_seen = Instant::now();
    env.abort_coordinator();

    // The drain completes while nobody can hear about it; new entries arrive on every shard.
    gate_a.set(true);
    let mut second = BTreeSet::new();
    for shard in 0..SHARDS {
        second.insert(env.produce_one(shard, 100 + u64::from(shard)).await);
    }
    // Watch a through the outage, until its lease has run out: the drained shards never come back.
    let mut status = a.watch_status();
    let outage = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            {
                let s = status.borrow_and_update();
                let back: BTreeSet<u32> = shards(&s.reading).intersection(&drained).copied().collect();
                assert!(back.is_empty(), "a resumed drained shards {back:?} during the outage");
                assert!(
                    drained.is_subset(&shards(&s.revoking)),
                    "drained shards must stay revoking: {:?}",
                    s.revoking
                );
                if s.heartbeats.lease_expiries >= 1 && s.reading.is_empty() {
                    break;
                }
            }
            status.changed().await.unwrap();
        }
    })
    .await;
    outage.expect("a's lease runs out during the outage");
    assert!(
        b.status().reading.is_empty(),
        "b never got the shards: they were pending until a's REVOKED"
    );
    let late: Vec<_> = rec
        .of("a")
        .into_iter()
        .filter(|r| drained.contains(&r.shard) && r.start > drain_seen)
        .collect();
    assert!(late.is_empty(), "a handled drained shards after DRAIN: {late:?}");

    env.restart_coordinator().await;
    wait_status(&b, Duration::from_secs(15), "b reads the drained shards", |s| {
        shards(&s.reading) == drained
    })
    .await;
    wait_status(&a, Duration::from_secs(15), "a reads its kept shards again", |s| {
        shards(&s.reading) == kept
    })
    .await;
    let all: BTreeSet<_> = first.union(&second).copied().collect();
    wait_all_handled(&env, &rec, &all).await;
    rec.assert_no_overlap();
    let late: Vec<_> = rec
        .of("a")
        .into_iter()
        .filter(|r| drained.contains(&r.shard) && r.start > drain_seen)
        .collect();
    assert!(late.is_empty(), "a handled drained shards after DRAIN: {late:?}");
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_expiry_stops_every_read_during_a_long_coordinator_outage_and_reading_resumes_after() {
    let mut env = Env::start("lease").await;
    let rec = Recorder::new();
    let producer = env.spawn_producer(Duration::from_millis(5));
    let a = env.consumer("a", &rec).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;

    let outage_start = Instant::now();
    env.abort_coordinator();
    // A short outage does not stop a healthy reader.
    test_support::wait_until(Duration::from_millis(1000), "reads to go on during the outage", || {
        let n = rec
            .of("a")
            .iter()
            .filter(|r| r.start > outage_start + Duration::from_millis(300))
            .count();
        async move { n > 0 }
    })
    .await;
    // A long one does, before the lease granted by the last successful heartbeat (sent before the outage) ends.
    wait_status(&a, LEASE * 3, "the lease to run out", |s| {
        s.heartbeats.lease_expiries >= 1 && s.reading.is_empty() && s.revoking.len() == 8
    })
    .await;
    let stopped = Instant::now();
    println!(
        "reads stopped {:?} after the outage started (lease {LEASE:?})",
        stopped - outage_start
    );
    // Entries keep arriving; wait for a good number of them, then check none was read.
    test_support::wait_until(
        Duration::from_secs(5),
        "entries produced after the lease expiry",
        || {
            let n = producer.produced_since(stopped);
            async move { n >= 50 }
        },
    )
    .await;
    let after_lease: Vec<_> = rec
        .all()
        .into_iter()
        .filter(|r| r.start > outage_start + LEASE)
        .collect();
    assert!(
        after_lease.is_empty(),
        "handled after the lease ran out: {after_lease:?}"
    );
    assert!(
        a.status().reading.is_empty(),
        "a failing heartbeat never resumes a revoking shard"
    );

    env.restart_coordinator().await;
    wait_status(&a, Duration::from_secs(15), "a reads all 8 again", |s| {
        s.reading.len() == 8
    })
    .await;
    let produced = producer.stop().await;
    wait_all_handled(&env, &rec, &produced).await;
    rec.assert_no_overlap();
    a.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metadata_rollback_gets_sync_metadata_then_revoke_pending_then_ok() {
    let env = Env::start("rollback").await;
    let rec = Recorder::new();
    let producer = env.spawn_producer(Duration::from_millis(5));
    let a = env.consumer("a", &rec).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| {
        s.reading.len() == 8 && s.revoking.is_empty()
    })
    .await;
    let snapshot = env.redis.snapshot_keys(&env.group_state_pattern()).await;
    assert_eq!(
        snapshot.len(),
        2,
        "metadata and liveness: {:?}",
        snapshot.keys().collect::<Vec<_>>()
    );
    let old_version = env.describe().await.metadata_version;

    let b = env.consumer("b", &rec).build().unwrap().spawn();
    wait_status(&b, Duration::from_secs(10), "b reads 4", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    wait_status(&a, Duration::from_secs(10), "a reads 4", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    let seen = a.status().metadata_version;
    assert!(seen > old_version);

    // Redis loses the recent writes: it records a as the owner of all 8 shards and has never heard of b.
    env.redis.restore_snapshot(&snapshot).await;
    let rolled_back_at = Instant::now();

    wait_status(
        &a,
        Duration::from_secs(10),
        "a to get SYNC_METADATA then REVOKE_PENDING",
        |s| s.heartbeats.sync_metadata >= 1 && s.heartbeats.revoke_pending >= 1,
    )
    .await;
    let st = a.status();
    assert_eq!(st.metadata_version, old_version, "a adopted the version Redis has");
    assert!(
        st.max_observed_version >= seen,
        "and still remembers the highest one it saw"
    );
    wait_status(&b, Duration::from_secs(10), "b to be told it is unknown", |s| {
        s.heartbeats.unknown_member >= 1
    })
    .await;

    // The round closes after a member TTL; then OK again and a balanced group.
    wait_status(&a, Duration::from_secs(20), "a back to OK", |s| {
        s.last_status == Some(Status::Ok)
    })
    .await;
    wait_status(&a, Duration::from_secs(20), "a reads 4", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    wait_status(&b, Duration::from_secs(20), "b reads 4", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    assert!(
        env.describe().await.correction.is_none(),
        "the correction round is closed"
    );
    let ok_again = Instant::now();
    println!(
        "correction round: {:?} from the rollback to a balanced group",
        ok_again - rolled_back_at
    );
    assert!(
        ok_again - rolled_back_at >= MEMBER_TTL - HEARTBEAT,
        "the round waits a member TTL"
    );

    let produced = producer.stop().await;
    wait_all_handled(&env, &rec, &produced).await;
    rec.assert_no_overlap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_version_store_survives_a_restart_and_the_restarted_consumer_triggers_the_correction_round() {
    let env = Env::start("file-store").await;
    let dir = tempfile::tempdir().unwrap();
    let rec = Recorder::new();
    // Redis as it was right after the group was created.
    let snapshot = env.redis.snapshot_keys(&env.group_state_pattern()).await;
    let created_version = env.describe().await.metadata_version;

    let first = env
        .consumer("a", &rec)
        .version_store(FileVersionStore::new(dir.path()).unwrap())
        .build()
        .unwrap()
        .spawn();
    wait_status(&first, Duration::from_secs(10), "the first process reads all 8", |s| {
        s.reading.len() == 8
    })
    .await;
    let seen = first.status().max_observed_version;
    assert!(first.close().await.unwrap().left);
    let key = stream_consumer::version_store::version_key(&env.stream, &env.group);
    let stored = FileVersionStore::new(dir.path()).unwrap().load(&key).await.unwrap();
    assert!(
        stored >= seen.0 && stored > created_version.0,
        "stored {stored}, seen {seen}"
    );

    // Redis rolls back to before the first process ever joined.
    env.redis.restore_snapshot(&snapshot).await;
    assert!(env.describe().await.correction.is_none());

    // A new process (new instance id, empty memory) with the same file: it reports the version it saw before.
    let second = env
        .consumer("a", &rec)
        .version_store(FileVersionStore::new(dir.path()).unwrap())
        .build()
        .unwrap()
        .spawn();
    wait_status(&second, Duration::from_secs(10), "the restarted process joined", |s| {
        s.joined
    })
    .await;
    assert_eq!(second.status().max_observed_version.0, stored, "loaded from the file");
    let desc = env.describe().await;
    let round = desc
        .correction
        .expect("the restarted consumer opened a correction round");
    assert!(round.reported_max_version.0 >= stored);
    assert!(
        second.status().heartbeats.revoke_pending >= 1,
        "no shard is handed out while the round is open"
    );
    assert!(second.status().reading.is_empty());
    wait_status(
        &second,
        Duration::from_secs(20),
        "reading after the round closed",
        |s| s.reading.len() == 8,
    )
    .await;
    assert!(env.describe().await.correction.is_none());
    second.close().await.unwrap();
}

/// One rebalance callback: its kind and shards.
type Callback = (&'static str, Vec<u32>);

/// Records rebalance callbacks.
#[derive(Clone, Default)]
struct Callbacks(std::sync::Arc<std::sync::Mutex<Vec<Callback>>>);

impl stream_consumer::RebalanceListener for Callbacks {
    async fn on_assigned(&self, shard: stream_consumer::ShardId, _token: stream_consumer::FencingToken) {
        self.0.lock().unwrap().push(("assigned", vec![shard.0]));
    }

    async fn on_revoked(&self, shard: stream_consumer::ShardId) {
        self.0.lock().unwrap().push(("revoked", vec![shard.0]));
    }

    async fn on_lost(&self, shards: Vec<stream_consumer::ShardId>) {
        self.0
            .lock()
            .unwrap()
            .push(("lost", shards.iter().map(|s| s.0).collect()));
    }
}

impl Callbacks {
    fn count(&self, kind: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, s)| s.len())
            .sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fenced_member_stops_every_reader_reports_them_lost_and_rejoins() {
    let env = Env::start("fenced").await;
    let rec = Recorder::new();
    let callbacks = Callbacks::default();
    let producer = env.spawn_producer(Duration::from_millis(5));
    let a = env
        .consumer("a", &rec)
        .rebalance_listener(callbacks.clone())
        .build()
        .unwrap()
        .spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    test_support::wait_until(Duration::from_secs(5), "on_assigned for every shard", || {
        let n = callbacks.count("assigned");
        async move { n == 8 }
    })
    .await;

    let member = protocol::names::MemberId::new("a").unwrap();
    env.coord()
        .coordinator()
        .fence_member(&env.stream, &env.group, &member, None)
        .await
        .expect("fence a");
    let mut status = a.watch_status();
    // The first status after the FENCED answer: every reader already stopped, joining again.
    let fenced = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            {
                let s = status.borrow_and_update();
                if s.heartbeats.fenced >= 1 {
                    return s.clone();
                }
            }
            status.changed().await.unwrap();
        }
    })
    .await
    .expect("a is told it is fenced");
    let fenced_at = Instant::now();
    assert!(fenced.reading.is_empty() && fenced.revoking.is_empty(), "{fenced:?}");
    assert_eq!(fenced.member_epoch, protocol::MemberEpoch::JOIN, "rejoins with epoch 0");
    assert_eq!(callbacks.count("lost"), 8, "every shard reported lost");
    assert_eq!(callbacks.count("revoked"), 0, "nothing was revoked in an orderly way");

    wait_status(&a, MEMBER_TTL * 5, "a reads all 8 again as a new incarnation", |s| {
        s.reading.len() == 8
    })
    .await;
    let back = Instant::now();
    println!("fenced member reading again {:?} after it was fenced", back - fenced_at);
    assert_eq!(a.status().heartbeats.rejoins, 1);
    let produced = producer.stop().await;
    wait_all_handled(&env, &rec, &produced).await;
    rec.assert_no_overlap();
    assert!(a.close().await.unwrap().left);
    assert_eq!(
        callbacks.count("revoked"),
        8,
        "close revokes every shard in an orderly way"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reader_connections_that_drop_reconnect_and_nothing_is_lost() {
    let env = Env::start("redis-reset").await;
    let target = format!("127.0.0.1:{}", env.redis.port()).parse().unwrap();
    let proxy = test_support::FaultProxy::start(target).await;
    let rec = Recorder::new();
    // The producer writes to Redis directly; only the consumer's connections go through the proxy.
    let producer = env.spawn_producer(Duration::from_millis(5));
    let a = env.consumer("a", &rec).redis(proxy.url()).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    test_support::wait_until(Duration::from_secs(5), "entries handled", || {
        let n = rec.acked().len();
        async move { n > 20 }
    })
    .await;

    for _ in 0..3 {
        let reset_at = Instant::now();
        proxy.set_mode(test_support::Mode::Reset);
        test_support::wait_until(
            Duration::from_secs(5),
            "entries produced while connections are reset",
            || {
                let n = producer.produced_since(reset_at);
                async move { n >= 40 }
            },
        )
        .await;
        proxy.set_mode(test_support::Mode::Pass);
        let healed_at = Instant::now();
        test_support::wait_until(Duration::from_secs(10), "reads to resume on every shard", || {
            let read = rec.shards_read_after("a", healed_at);
            async move { read.len() == SHARDS as usize }
        })
        .await;
    }
    assert_eq!(a.status().reading.len(), 8, "the coordinator side never noticed");
    let produced = producer.stop().await;
    wait_all_handled(&env, &rec, &produced).await;
    rec.assert_no_overlap();
    assert!(a.close().await.unwrap().left);
}
