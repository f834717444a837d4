//! Incarnations end to end, with real processes (issue 29): a member id is a name that a new process, or the same
//! process after it gave its shards back, may take again; a request of an earlier join must never act on a later
//! one.
//!
//! * **Rejoin** ([`a_late_leave_held_by_a_stalled_or_terminating_replica_never_removes_the_rejoined_member`]): two
//!   coordinator processes on one Redis; worker A's Redis becomes unreachable, A gives its shards back and its leave
//!   lands in replica C1, which holds it at its write boundary ([`CoordProcess::hold`]); C1 is then stopped
//!   (SIGSTOP) or terminated (SIGTERM: its graceful shutdown finishes the entered section); A rejoins through C2 and
//!   reads; then C1's leave goes on. It must not remove A's new incarnation.
//! * **Replacement** ([`a_replaced_worker_resumed_in_a_correction_round_ends_and_shares_no_shard_or_token`]): worker
//!   A is stopped past its TTL, A' starts with the same member id, reads; the group's metadata is rolled back to
//!   when A was the member (a correction round opens) and A is resumed during the round. A must end (it was
//!   replaced), A' must read in the end.
//! * **A stopped coordinator** ([`a_coordinator_stopped_past_its_request_timeout_answers_the_request_it_held`]): a
//!   coordinator process stopped for longer than its request timeout while a request is in flight answers it
//!   `200` once resumed, not `503 STORE_UNAVAILABLE` ("timed out").
//! * The version-creep probe of the same issue is in `version_creep.rs`.
//!
//! In the two process cases, every handler invocation of every worker process is recorded
//! ([`scenario_tests::stall_log`], with its fencing token) and checked: no two processes handled one shard at
//! overlapping times within their leases (the history checker's rule (a)), no handler completed after its lease,
//! and no fencing token of a shard was used by two processes (each new owner's token above the previous one's).
//! Each case runs [`runs`] times (`INCARNATION_RUNS`, default 22: a defect that shows in one run in ten is then
//! caught with probability 1 - 0.9^22 ≈ 0.90); each run is judged on its own and a summary is printed.
//!
//! The coordinator processes are this test binary started again ([`common::coord_process`] says why):
//! [`coord_process`] is their body, not a test.

mod common;

use common::*;
use protocol::messages::{HeartbeatResponse, MemberDescription, RevokeState};
use protocol::Status;
use reqwest::StatusCode;
use scenario_tests::stall_log::{wall_us, Kind, Record};
use scenario_tests::{Handled, History, Violation};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream_producer::Producer;
use test_support::{wait_until, FaultProxy, Mode, RedisServer};

/// Not a test: the body of the coordinator processes this file's tests start ([`common::coord_process`]).
#[test]
#[ignore = "the coordinator process of this file's tests; runs only when they start it"]
fn coord_process() {
    child_main();
}

const SHARDS: u32 = 8;
/// How long each worker handler runs: short, so shards change hands quickly, and long enough to be in flight
/// at a stop.
const HANDLE_FOR: Duration = Duration::from_millis(40);
/// Worker A's `read_failure_timeout` in the rejoin case: how long its Redis is unreachable before it gives back.
const READ_FAILURE: Duration = Duration::from_millis(500);
/// Tolerance of the completion-after-lease check (the worker reads the lease end from its consumer's status).
const SLACK_US: u64 = 20_000;

/// Runs per case: `INCARNATION_RUNS`, default 22.
fn runs() -> usize {
    std::env::var("INCARNATION_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(22)
}

// ---------------------------------------------------------------------------------------------------------------
// Rejoin: a late leave held by a stalled or terminating replica.
// ---------------------------------------------------------------------------------------------------------------

/// What happens to the replica holding the leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// SIGSTOP while it holds the leave, SIGCONT once A reads again.
    Stalled,
    /// SIGTERM while it holds the leave: its graceful shutdown finishes the section, then it exits.
    Terminating,
}

impl Holder {
    /// How long C1 holds the leave. Stalled: stopped inside the hold, so the hold only has to outlast the
    /// SIGSTOP's delivery. Terminating: the hold runs in real time and must outlast A's rejoin through C2 (about
    /// one request timeout of A plus a Redis check); checked by every run (`rejoined_in_hold`).
    fn hold(self) -> Duration {
        match self {
            Holder::Stalled => Duration::from_millis(1500),
            Holder::Terminating => Duration::from_millis(3000),
        }
    }
}

/// Redis, two coordinator processes, the group, a producer and worker B (on C2 only).
struct RejoinRig {
    redis: RedisServer,
    dir: PathBuf,
    stream: String,
    group: String,
    c1: CoordProcess,
    /// How many C1 processes were started (a terminated one is replaced).
    c1_starts: usize,
    c2: CoordProcess,
}

impl RejoinRig {
    fn api2(&self) -> GroupApi {
        GroupApi {
            api: Api::new(self.c2.url()),
            stream: self.stream.clone(),
            group: self.group.clone(),
        }
    }

    fn worker(&self, coordinators: &[String], redis: String, read_failure: Option<Duration>) -> StallWorker {
        StallWorker {
            coordinators: coordinators.join(","),
            redis,
            stream: self.stream.clone(),
            group: self.group.clone(),
            handle: HANDLE_FOR,
            read_failure,
        }
    }

    async fn start_c1(&mut self) {
        self.c1_starts += 1;
        let name = format!("c1.{}", self.c1_starts);
        self.c1 = CoordProcess::start(&CoordSpec::new(self.redis.url()), &self.dir, &name).await;
    }

    /// The member as C2 reads it.
    async fn member(&self, id: &str) -> Option<MemberDescription> {
        let g = self.api2().describe().await.expect("describe through C2");
        member(&g, id).cloned()
    }
}

/// One rejoin run, as observed.
#[derive(Debug)]
struct RejoinRun {
    run: usize,
    holder: Holder,
    /// A rejoined and read again while C1 still held the leave (the run tested what it meant to).
    rejoined_in_hold: bool,
    /// A's rejoin created a new incarnation.
    new_incarnation: bool,
    /// A's incarnation at the end is the one it rejoined with: the late leave did not remove it.
    incarnation_kept: bool,
    /// A read after the leave went on.
    kept_reading: bool,
    checked: Checked,
    took: Duration,
}

impl RejoinRun {
    fn failed(&self) -> bool {
        !self.new_incarnation || !self.incarnation_kept || !self.kept_reading || !self.checked.is_ok()
    }
}

/// A's shards given back because its Redis is unreachable, its leave held by replica C1 while C1 is stopped or
/// terminating, A rejoined through C2: when C1's section goes on, it decides again on what Redis then holds and
/// refuses the leave (it names the incarnation A gave up), so A keeps its new incarnation and reads on, and no two
/// processes read a shard at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_leave_held_by_a_stalled_or_terminating_replica_never_removes_the_rejoined_member() {
    init_tracing();
    let redis = RedisServer::start().await;
    let dir = records_dir("incarnations-rejoin");
    let spec = CoordSpec::new(redis.url());
    let c1 = CoordProcess::start(&spec, &dir, "c1.1").await;
    let c2 = CoordProcess::start(&spec, &dir, "c2").await;
    let mut rig = RejoinRig {
        redis,
        dir: dir.clone(),
        stream: "rejoin-stream".into(),
        group: "rejoin-group".into(),
        c1,
        c1_starts: 1,
        c2,
    };
    rig.api2().create(SHARDS).await.expect("group created");

    let history = History::new();
    let producer = Producer::builder(rig.stream.as_str())
        .coordinators([rig.c2.url()])
        .redis(rig.redis.url())
        .coordinator_timeout(Duration::from_millis(400))
        .refresh_retry(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .expect("producer");
    let publisher = Publisher::spawn(Arc::new(producer), &history, Duration::from_millis(10), 48);
    let b_worker = rig.worker(&[rig.c2.url()], rig.redis.url(), None);
    let mut b = WorkerProcess::start(&b_worker, "b", &dir, "b");
    wait_until(DEADLINE, "worker B to read", || {
        let n = b.starts_since(0);
        async move { n > 0 }
    })
    .await;

    let mut results = Vec::new();
    for run in 0..runs() {
        let holder = if run % 2 == 0 {
            Holder::Stalled
        } else {
            Holder::Terminating
        };
        let r = rejoin_run(&mut rig, run, holder).await;
        println!(
            "rejoin run {} ({:?}, {:.1} s): rejoined in the hold {}, new incarnation {}, incarnation kept {}, kept \
             reading {}; {}",
            r.run,
            r.holder,
            r.took.as_secs_f64(),
            r.rejoined_in_hold,
            r.new_incarnation,
            r.incarnation_kept,
            r.kept_reading,
            r.checked
        );
        results.push(r);
    }
    publisher.stop().await;
    b.close().await;

    let failed: Vec<&RejoinRun> = results.iter().filter(|r| r.failed()).collect();
    let not_in_hold = results.iter().filter(|r| !r.rejoined_in_hold).count();
    let mean = results.iter().map(|r| r.took.as_secs_f64()).sum::<f64>() / results.len().max(1) as f64;
    println!(
        "rejoin: {} runs ({:.1} s each on average), {} failed (no new incarnation: {}, incarnation lost: {}, stopped \
         reading: {}, overlap or late: {}, tokens: {}), {} without the rejoin inside the hold",
        results.len(),
        mean,
        failed.len(),
        results.iter().filter(|r| !r.new_incarnation).count(),
        results.iter().filter(|r| !r.incarnation_kept).count(),
        results.iter().filter(|r| !r.kept_reading).count(),
        results.iter().filter(|r| r.checked.overlap_or_late()).count(),
        results.iter().filter(|r| r.checked.token_broken()).count(),
        not_in_hold
    );
    assert!(failed.is_empty(), "failed runs: {failed:#?}");
    assert_eq!(
        not_in_hold, 0,
        "every run rejoined while C1 held the leave: {results:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

async fn rejoin_run(rig: &mut RejoinRig, run: usize, holder: Holder) -> RejoinRun {
    let started = Instant::now();
    let from_us = wall_us();
    let id = format!("a{run}");
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], rig.redis.port()))).await;
    let a_worker = rig.worker(&[rig.c1.url(), rig.c2.url()], proxy.url(), Some(READ_FAILURE));
    let mut a = WorkerProcess::start(&a_worker, &id, &rig.dir, &id);
    wait_until(DEADLINE, "A to read", || {
        let n = a.starts_since(from_us);
        async move { n > 0 }
    })
    .await;
    let first = rig.member(&id).await.expect("A is a member").incarnation;

    // A's Redis refuses every connection: its readers fail at once, and after READ_FAILURE it gives every shard
    // back; its leave goes to its first coordinator, C1, which holds it.
    rig.c1.hold(HoldOn::Left, &id, holder.hold()).await;
    proxy.set_mode(Mode::Reset);
    rig.c1.holding(HoldOn::Left, &id).await;
    match holder {
        Holder::Stalled => rig.c1.stop(),
        Holder::Terminating => rig.c1.terminate(),
    }
    let held_us = wall_us();
    proxy.set_mode(Mode::Pass);

    // A joins again (C1 does not answer, or refuses as terminating: C2 does) and reads.
    wait_until(DEADLINE, "A to read again", || {
        let n = a.starts_since(held_us);
        async move { n > 0 }
    })
    .await;
    let rejoined = rig.member(&id).await.map(|m| m.incarnation);
    // A new incarnation, not the one it gave up (the leave names that one).
    let new_incarnation = rejoined.is_some_and(|i| i != first);
    let rejoined_in_hold = match holder {
        Holder::Stalled => true,
        Holder::Terminating => rig.c1.try_exit().is_none() && !rig.c1.said("coord stopped"),
    };

    // The held leave goes on.
    match holder {
        Holder::Stalled => rig.c1.resume(),
        Holder::Terminating => {
            let status = rig.c1.exited(DEADLINE).await;
            assert!(
                status.success(),
                "C1 shut down cleanly: {status}; log:\n{}",
                rig.c1.log()
            );
        }
    }
    let released_us = wall_us();
    // Real time, on purpose: a leave that removed A shows within a heartbeat (A's next one is refused and it
    // joins again with yet another incarnation; the shards go to B at B's next heartbeat while A may still read
    // them under its lease). Two leases cover both.
    tokio::time::sleep(2 * LEASE).await;
    let last = rig.member(&id).await;
    let incarnation_kept = last.as_ref().is_some_and(|m| Some(m.incarnation) == rejoined);
    let kept_reading = a.starts_since(released_us + LEASE.as_micros() as u64) > 0 && a.try_exit().is_none();

    a.close().await;
    drop(proxy);
    if holder == Holder::Terminating {
        rig.start_c1().await;
    }
    let checked = check(&read_records(&rig.dir), from_us);
    RejoinRun {
        run,
        holder,
        rejoined_in_hold,
        new_incarnation,
        incarnation_kept,
        kept_reading,
        checked,
        took: started.elapsed(),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Replacement: the replaced process resumed in a correction round.
// ---------------------------------------------------------------------------------------------------------------

/// One replacement run, as observed.
#[derive(Debug)]
struct ReplacementRun {
    run: usize,
    /// A was resumed while the correction round was open.
    resumed_in_round: bool,
    /// A's exit status (3: `MEMBER_REPLACED`), or `None` if it was still running.
    a_exit: Option<i32>,
    /// A' read after the round closed and still runs.
    replacement_reads: bool,
    checked: Checked,
    took: Duration,
}

impl ReplacementRun {
    fn failed(&self) -> bool {
        self.a_exit != Some(EXIT_REPLACED) || !self.replacement_reads || !self.checked.is_ok()
    }
}

/// `stall_worker`'s exit status when it was replaced.
const EXIT_REPLACED: i32 = 3;

/// Worker A stopped past its TTL, A' started with the same member id and reading, then the metadata rolled back
/// to when A held the member id and A resumed during the correction round that follows: A is answered
/// `MEMBER_REPLACED` and ends, A' rejoins (Redis lost its incarnation) and reads once the round closed, and the
/// two never read one shard at once or with one token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_worker_resumed_in_a_correction_round_ends_and_shares_no_shard_or_token() {
    let s = Scenario::start("replaced", SHARDS).await;
    let dir = records_dir("incarnations-replaced");
    let worker = StallWorker {
        coordinators: s.urls().join(","),
        redis: s.redis.url(),
        stream: s.stream.to_string(),
        group: s.group.to_string(),
        handle: HANDLE_FOR,
        read_failure: None,
    };
    let history = History::new();
    let publisher = Publisher::spawn(
        Arc::new(s.producer().build().unwrap()),
        &history,
        Duration::from_millis(10),
        48,
    );
    let mut b = WorkerProcess::start(&worker, "b", &dir, "b");
    wait_until(DEADLINE, "worker B to read", || {
        let n = b.starts_since(0);
        async move { n > 0 }
    })
    .await;

    let mut results = Vec::new();
    for run in 0..runs() {
        let r = replacement_run(&s, &worker, &dir, run).await;
        println!(
            "replacement run {} ({:.1} s): resumed in the round {}, A's exit {:?}, A' reads {}; {}",
            r.run,
            r.took.as_secs_f64(),
            r.resumed_in_round,
            r.a_exit,
            r.replacement_reads,
            r.checked
        );
        results.push(r);
    }
    publisher.stop().await;
    b.close().await;

    let failed: Vec<&ReplacementRun> = results.iter().filter(|r| r.failed()).collect();
    let not_in_round = results.iter().filter(|r| !r.resumed_in_round).count();
    let mean = results.iter().map(|r| r.took.as_secs_f64()).sum::<f64>() / results.len().max(1) as f64;
    println!(
        "replacement: {} runs ({:.1} s each on average), {} failed (A did not end replaced: {}, A' not reading: {}, \
         overlap or late: {}, tokens: {}), {} resumed outside the round",
        results.len(),
        mean,
        failed.len(),
        results.iter().filter(|r| r.a_exit != Some(EXIT_REPLACED)).count(),
        results.iter().filter(|r| !r.replacement_reads).count(),
        results.iter().filter(|r| r.checked.overlap_or_late()).count(),
        results.iter().filter(|r| r.checked.token_broken()).count(),
        not_in_round
    );
    assert!(
        failed.is_empty(),
        "{} replacement runs failed: {failed:#?}",
        failed.len()
    );
    assert_eq!(not_in_round, 0, "every run resumed A inside the round: {results:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

async fn replacement_run(s: &Scenario, worker: &StallWorker, dir: &Path, run: usize) -> ReplacementRun {
    let started = Instant::now();
    let from_us = wall_us();
    let id = format!("w{run}");
    let mut a = WorkerProcess::start(worker, &id, dir, &format!("{id}.1"));
    wait_until(DEADLINE, "A to read", || {
        let n = a.starts_since(from_us);
        async move { n > 0 }
    })
    .await;
    // What Redis will fall back to: A holds the member id.
    let snapshot = s.redis.snapshot_keys(&s.group_state_pattern()).await;

    a.stop();
    let stopped = Instant::now();
    let mut a2 = WorkerProcess::start(worker, &id, dir, &format!("{id}.2"));
    let a2_from = wall_us();
    wait_until(DEADLINE, "A' to read", || {
        let n = a2.starts_since(a2_from);
        async move { n > 0 }
    })
    .await;
    // Real time, on purpose: the stop must outlast the member TTL (a process paused that long).
    tokio::time::sleep_until((stopped + TTL + Duration::from_millis(100)).into()).await;

    s.redis.restore_snapshot(&snapshot).await;
    wait_until(DEADLINE, "the correction round to open", || async {
        s.describe().await.correction.is_some()
    })
    .await;
    a.resume();
    // A round stays open for at least a member TTL after it opened; looked at once more right after the resume.
    let resumed_in_round = s.describe().await.correction.is_some();

    let a_exit = a.exit_within(DEADLINE).await.and_then(|status| status.code());
    // A' reads once the round closed (and still runs).
    let closed_us = test_support::poll_for(DEADLINE, || async {
        s.describe().await.correction.is_none().then(wall_us)
    })
    .await;
    let replacement_reads = match closed_us {
        Some(closed_us) => test_support::poll_for(DEADLINE, || {
            let n = a2.starts_since(closed_us);
            async move { (n > 0).then_some(()) }
        })
        .await
        .is_some_and(|()| a2.try_exit().is_none()),
        None => false,
    };
    if a_exit != Some(EXIT_REPLACED) {
        eprintln!("A did not end replaced (exit {a_exit:?}); its log:\n{}", a.log());
    }
    a.close().await;
    a2.close().await;
    let checked = check(&read_records(dir), from_us);
    ReplacementRun {
        run,
        resumed_in_round,
        a_exit,
        replacement_reads,
        checked,
        took: started.elapsed(),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Checking the records of the worker processes.
// ---------------------------------------------------------------------------------------------------------------

/// What the worker records of one run show (descriptions of what broke; empty when all holds).
#[derive(Debug, Default)]
struct Checked {
    invocations: usize,
    /// Two processes handled one shard at overlapping times, or a handler started after its lease ended (the
    /// history checker's rule (a), one "member" per process).
    overlaps: Vec<String>,
    /// A handler completed after its lease end.
    late: Vec<String>,
    /// A shard's fencing token used by two processes.
    shared_tokens: Vec<String>,
    /// A process handled a shard with a token not above the previous process's on that shard.
    not_increasing: Vec<String>,
}

impl Checked {
    fn is_ok(&self) -> bool {
        !self.overlap_or_late() && !self.token_broken()
    }

    fn overlap_or_late(&self) -> bool {
        !self.overlaps.is_empty() || !self.late.is_empty()
    }

    fn token_broken(&self) -> bool {
        !self.shared_tokens.is_empty() || !self.not_increasing.is_empty()
    }
}

impl std::fmt::Display for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} invocations: {} overlaps, {} late completions, {} shared tokens, {} tokens not increasing",
            self.invocations,
            self.overlaps.len(),
            self.late.len(),
            self.shared_tokens.len(),
            self.not_increasing.len()
        )?;
        let all = self.overlaps.iter().chain(&self.late).chain(&self.shared_tokens);
        for e in all.chain(&self.not_increasing).take(6) {
            write!(f, "\n    {e}")?;
        }
        Ok(())
    }
}

/// Checks the records of handlers started at or after `from_us` (one run: the processes of earlier runs have
/// exited by then; B's handlings count from there).
fn check(records: &[Record], from_us: u64) -> Checked {
    let records: Vec<&Record> = records.iter().filter(|r| r.start_us >= from_us).collect();
    let who = |r: &Record| format!("{}#{}", r.member, r.pid);
    // One conversion for every record, so the same record always maps to the same instant.
    let (base, base_us) = (Instant::now(), wall_us());
    let at = |us: u64| {
        if us >= base_us {
            base + Duration::from_micros(us - base_us)
        } else {
            base - Duration::from_micros(base_us - us)
        }
    };
    let key = |r: &Record| (r.pid, r.shard, r.entry, r.start_us);
    let starts: BTreeMap<_, &Record> = records
        .iter()
        .filter(|r| r.kind == Kind::Start)
        .map(|r| (key(r), *r))
        .collect();
    let mut ends: BTreeMap<_, &Record> = BTreeMap::new();
    for r in records.iter().filter(|r| r.kind != Kind::Start) {
        ends.insert(key(r), *r);
    }

    let history = History::new();
    let mut late = Vec::new();
    for (k, start) in &starts {
        let lease_us = start.lease_end_us;
        let end = ends.get(k);
        // A completion counts until it returned; a handler dropped unfinished, or never finished (its process was
        // killed), ran within its lease at most: that is all it could do under it.
        let (ended_us, ok) = match end {
            Some(e) if e.kind == Kind::End => {
                if e.lease_end_us.is_none_or(|l| e.at_us > l + SLACK_US) {
                    late.push(format!("completed after its lease end: {e}"));
                }
                (e.at_us, true)
            }
            Some(e) => (lease_us.map_or(e.at_us, |l| e.at_us.min(l)), false),
            None => match lease_us {
                Some(l) => (l, false),
                None => continue,
            },
        };
        history.record_handled(Handled {
            member: who(start),
            shard: start.shard,
            entry: start.entry,
            key: None,
            delivery: 1,
            started: at(start.start_us),
            ended: at(ended_us.max(start.start_us)),
            started_wall: std::time::UNIX_EPOCH + Duration::from_micros(start.start_us),
            lease_until: lease_us.map(at),
            ok,
        });
    }
    let overlaps = history
        .check()
        .violations
        .into_iter()
        .filter_map(|v| match v {
            Violation::Overlap {
                shard,
                first,
                first_until,
                second,
                second_from,
            } => Some(format!(
                "shard {shard}: {second} started handling it {} ms before {first} stopped",
                (first_until - second_from).as_millis()
            )),
            Violation::OutsideLease {
                member,
                shard,
                entry,
                late_by,
            } => Some(format!(
                "shard {shard}: {member} started {entry} {} ms after its lease ended",
                late_by.as_millis()
            )),
            _ => None,
        })
        .collect();

    // Tokens, per shard: which processes used each, and in which order the processes came.
    let mut shared_tokens = Vec::new();
    let mut not_increasing = BTreeSet::new();
    let mut by_shard: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in starts.values() {
        by_shard.entry(r.shard).or_default().push(r);
    }
    for (shard, mut list) in by_shard {
        let mut users: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        for r in &list {
            users.entry(r.token).or_default().insert(who(r));
        }
        for (token, procs) in users.iter().filter(|(_, p)| p.len() > 1) {
            shared_tokens.push(format!("shard {shard}: token {token} used by {procs:?}"));
        }
        // Stints: consecutive handlings of one process, with the tokens they carried.
        list.sort_by_key(|r| r.start_us);
        let mut stints: Vec<(String, u64, u64)> = Vec::new();
        for r in list {
            match stints.last_mut() {
                Some((p, lo, hi)) if *p == who(r) => {
                    *lo = (*lo).min(r.token);
                    *hi = (*hi).max(r.token);
                }
                _ => stints.push((who(r), r.token, r.token)),
            }
        }
        for pair in stints.windows(2) {
            let ((p, _, hi), (q, lo, _)) = (&pair[0], &pair[1]);
            if lo <= hi {
                not_increasing.insert(format!("shard {shard}: {q} used token {lo} after {p} used {hi}"));
            }
        }
    }
    Checked {
        invocations: starts.len(),
        overlaps,
        late,
        shared_tokens,
        not_increasing: not_increasing.into_iter().collect(),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// A coordinator stopped past its request timeout.
// ---------------------------------------------------------------------------------------------------------------

/// The coordinator's request timeout in this test.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the coordinator stays stopped: well past its request timeout.
const STOPPED_FOR: Duration = Duration::from_millis(2500);
/// How long the join's section is held at its write boundary: the stop lands inside it; shorter than the
/// request timeout, so without the stop the request would be answered in time.
const JOIN_HOLD: Duration = Duration::from_millis(500);

/// A coordinator process stopped (SIGSTOP) for longer than its request timeout while it works on a join, then
/// resumed: every timer it had fires late at once, and the request deadline forgives that one expiry, so the join
/// is answered `200`, not `503 STORE_UNAVAILABLE` "timed out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_stopped_past_its_request_timeout_answers_the_request_it_held() {
    init_tracing();
    let redis = RedisServer::start().await;
    let dir = records_dir("incarnations-stopped-coordinator");
    let spec = CoordSpec {
        redis_url: redis.url(),
        request_timeout: Some(REQUEST_TIMEOUT),
    };
    let mut c = CoordProcess::start(&spec, &dir, "c").await;
    let api = GroupApi {
        api: Api::new(c.url()),
        stream: "stopped-stream".into(),
        group: "stopped-group".into(),
    };
    api.create(SHARDS).await.expect("group created");
    // A client that waits longer than the stop.
    let http = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .expect("http client");
    let url = api.api.url(&protocol::routes::heartbeat(&api.stream, &api.group));
    for i in 0..3 {
        let id = format!("m{i}");
        c.hold(HoldOn::Joined, &id, JOIN_HOLD).await;
        let req = WireMember::new(&id).request(RevokeState::Revoked);
        let sent = Instant::now();
        let call = tokio::spawn({
            let (http, url) = (http.clone(), url.clone());
            async move {
                let resp = http.post(url).json(&req).send().await.expect("an answer");
                (resp.status(), resp.text().await.expect("a body"))
            }
        });
        c.holding(HoldOn::Joined, &id).await;
        c.stop();
        // Real time, on purpose: the process must stay stopped past its request deadline.
        tokio::time::sleep(STOPPED_FOR).await;
        c.resume();
        let (status, body) = call.await.expect("request task");
        let took = sent.elapsed();
        println!(
            "join {id}: {status} after {:.2} s (stopped {STOPPED_FOR:?})",
            took.as_secs_f64()
        );
        assert_eq!(
            status,
            StatusCode::OK,
            "the held join is answered: {body}; log:\n{}",
            c.log()
        );
        let answer: HeartbeatResponse = serde_json::from_str(&body).expect("a heartbeat answer");
        assert_eq!(answer.status, Status::Ok, "{answer:?}");
        assert!(answer.member_epoch.0 > 0, "joined: {answer:?}");
        assert!(
            took >= STOPPED_FOR,
            "the request was in flight across the stop ({took:?})"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
