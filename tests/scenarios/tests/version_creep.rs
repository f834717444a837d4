//! The version-creep probe (issue 29), end to end: a client whose every heartbeat reports a version one above
//! the last answer (a creeping version store) opens at most one correction round per Redis history, so a round is
//! open at most 5 % of the time, and a killed worker's shards are still read elsewhere within TTL + one heartbeat
//! (+ one tick).

mod common;

use common::*;
use protocol::messages::RevokeState;
use protocol::{MetadataVersion, ShardId};
use scenario_tests::History;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stream_consumer::{ConsumerHandle, ConsumerStatus};
use tokio::sync::watch;

/// How long the probe runs.
const PROBE_WINDOW: Duration = Duration::from_secs(60);
/// How often the probe looks whether a correction round is open.
const PROBE_SAMPLE: Duration = Duration::from_millis(50);
/// Most of the probe's time a round may be open.
const MAX_CORRECTION_SHARE: f64 = 0.05;
const PROBE_SHARDS: u32 = 6;

/// Three consumers and a client whose every heartbeat reports `maxObservedVersion` one above the version it was
/// last answered (a creeping version store): one correction round opens, and once it closed the reports are
/// ignored, so a round is open at most 5 % of the time. A consumer killed after that round hands its shards over
/// within TTL + one heartbeat interval + one tick interval (see the bound below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_creep_probe_spends_at_most_5_percent_in_correction_and_a_killed_workers_shards_move_in_time() {
    let s = Scenario::start("creep", PROBE_SHARDS).await;
    let history = History::new();
    let publisher = Publisher::spawn(
        Arc::new(s.producer().build().unwrap()),
        &history,
        Duration::from_millis(5),
        48,
    );
    let mut consumers: Vec<(String, ConsumerHandle)> = (0..3)
        .map(|i| {
            let id = format!("c{i}");
            let h = s.spawn_consumer(&id, &history);
            (id, h)
        })
        .collect();
    for (id, h) in &consumers {
        wait_status(h, DEADLINE, &format!("{id} reads"), |st| !st.reading.is_empty()).await;
    }

    let start = Instant::now();
    let end = start + PROBE_WINDOW;
    // The creeping client. It is a member too and may be given some of the killed consumer's shards: what it
    // "reads" (what its answers let it start, as the SDK would) is published for the failover measurement.
    let (creeper_reads, creeper_reading) = watch::channel(Vec::<ShardId>::new());
    let creeper = {
        let api = s.api();
        tokio::spawn(async move {
            let mut m = WireMember::new("creeper");
            let mut answers = 0u64;
            while Instant::now() < end {
                let mut req = m.request(RevokeState::Revoked);
                req.max_observed_version = MetadataVersion(m.version.0 + 1);
                if let Ok(r) = api.heartbeat(&req).await {
                    m.apply(&r, RevokeState::Revoked);
                    creeper_reads.send_replace(m.reading.iter().copied().collect());
                    answers += 1;
                }
                // Real time: a client's heartbeat interval, which the failover measurement samples.
                tokio::time::sleep(HEARTBEAT).await;
            }
            answers
        })
    };

    // Samples, and the kill once the first round closed.
    let mut samples = 0u64;
    let mut open_samples = 0u64;
    let mut rounds = 0u64;
    let mut was_open = false;
    let mut first_closed = None;
    let mut kill: Option<(Instant, String, Vec<ShardId>)> = None;
    let moved: Arc<Mutex<BTreeMap<ShardId, Duration>>> = Arc::default();
    let mut next = Instant::now();
    while Instant::now() < end {
        let open = s.describe().await.correction.is_some();
        samples += 1;
        if open {
            open_samples += 1;
            if !was_open {
                rounds += 1;
            }
        } else if was_open && first_closed.is_none() {
            first_closed = Some(Instant::now());
        }
        was_open = open;
        // Kill one consumer a few TTLs after the first round closed (its shards settled).
        if kill.is_none() && first_closed.is_some_and(|t| t.elapsed() > 2 * TTL) {
            let (id, h) = consumers.remove(0);
            let shards = h.status().reading.clone();
            let at = Instant::now();
            h.abort().await;
            // Every other reader watched from the kill on: the first time each of the shards shows in what it reads.
            for (_, other) in &consumers {
                let rx = other.watch_status();
                tokio::spawn(watch_moves(
                    rx,
                    |st: &ConsumerStatus| st.reading.clone(),
                    at,
                    shards.clone(),
                    Arc::clone(&moved),
                ));
            }
            tokio::spawn(watch_moves(
                creeper_reading.clone(),
                Vec::clone,
                at,
                shards.clone(),
                Arc::clone(&moved),
            ));
            kill = Some((at, id, shards));
        }
        next += PROBE_SAMPLE;
        tokio::time::sleep_until(next.into()).await;
    }
    let answers = creeper.await.expect("creeper");
    publisher.stop().await;

    let share = open_samples as f64 / samples as f64;
    let (killed_at, killed, shards) = kill.expect("a consumer was killed after the first round");
    // The first entry of each of the killed consumer's shards handled by another consumer after the kill.
    let first_read: BTreeMap<u32, Duration> = shards
        .iter()
        .filter_map(|shard| {
            history
                .handled()
                .iter()
                .filter(|h| h.shard == shard.0 && h.member != killed && h.started > killed_at)
                .map(|h| h.started - killed_at)
                .min()
                .map(|d| (shard.0, d))
        })
        .collect();
    // Expiry is decided by the tick (every TICK): the killed member's last renewal was at or before the kill, so
    // its lease ends at most TTL after it and a tick expires it at most TICK later; each freed shard is in its new
    // owner's next heartbeat answer, at most HEARTBEAT later, and the consumer starts its reader on that answer.
    let bound = TTL + HEARTBEAT + test_support::timings::TICK;
    println!(
        "version-creep probe: {:.1} s, {samples} samples every {PROBE_SAMPLE:?}, a round open in {open_samples} \
         ({:.2} %), {rounds} round(s), {answers} creeping heartbeats answered; killed {killed}: its shards {:?} \
         read elsewhere after {:?} (reader started) / {:?} (first entry handled); bound {bound:?}",
        start.elapsed().as_secs_f64(),
        share * 100.0,
        shards,
        moved,
        first_read
    );
    assert!(rounds >= 1, "the creeping reports opened a round");
    assert!(
        share <= MAX_CORRECTION_SHARE,
        "a round was open {:.2} % of the time",
        share * 100.0
    );
    assert!(!shards.is_empty(), "the killed consumer read something");
    let moved = moved.lock().unwrap().clone();
    for shard in &shards {
        let took = moved.get(shard).copied();
        assert!(
            took.is_some_and(|d| d <= bound),
            "shard {shard} of the killed consumer read elsewhere after {took:?}, bound {bound:?}"
        );
    }
    for (_, h) in consumers {
        let _ = h.close().await;
    }
}

/// Records in `moved` how long after `since` each of `shards` first showed in what the reader behind `rx` reads.
async fn watch_moves<T>(
    mut rx: watch::Receiver<T>,
    reading: impl Fn(&T) -> Vec<ShardId>,
    since: Instant,
    shards: Vec<ShardId>,
    moved: Arc<Mutex<BTreeMap<ShardId, Duration>>>,
) {
    loop {
        let now = reading(&rx.borrow_and_update());
        {
            let mut moved = moved.lock().unwrap();
            for shard in now.iter().filter(|s| shards.contains(s)) {
                moved.entry(*shard).or_insert_with(|| since.elapsed());
            }
            if shards.iter().all(|s| moved.contains_key(s)) {
                return;
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
