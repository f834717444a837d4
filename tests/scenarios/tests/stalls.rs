//! Stalled worker processes (SIGSTOP past their lease, as a long GC pause or a frozen VM would) never complete a
//! handler late, and no shard is handled by two processes at overlapping times.
//!
//! Real processes (`src/bin/stall_worker.rs`), each a member of one group, handlers that sleep across the stops;
//! the test's coordinator and Redis keep running. Two kinds of stops run concurrently:
//! * plain: SIGSTOP for longer than the member TTL (the coordinator expires the member and moves its shards to
//!   the others, whose handlers take over the entries that were in flight), then SIGCONT;
//! * replaced: the same, and while the process is stopped a replacement with the same member id starts (a new
//!   incarnation, held until the stopped one's lease ends); the old process is resumed, then killed.
//!
//! Counted and printed: stops, handlers in flight at each stop, completions after the lease end (must be 0).
//! A completion is late when the lease end its handler ran under (`stream_consumer::lease_deadline`) had passed,
//! or, seen from outside, when the handler started before a stop and completed after the SIGCONT (every stop
//! lasts longer than the lease, so its lease had run out by then).

mod common;

use common::*;
use scenario_tests::stall_log::{wall_us, wall_us_as_instant, Kind, Record};
use scenario_tests::{Handled, History};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SHARDS: u32 = 12;
/// Workers stopped and resumed.
const PLAIN_WORKERS: usize = 4;
/// Workers stopped, replaced by a process with the same member id, resumed and killed.
const REPLACED_WORKERS: usize = 2;
/// Longer than the member TTL (2 s): the coordinator expires the stopped member and its shards move.
const STOP_FOR: Duration = Duration::from_millis(2600);
/// Each handler sleeps this long: stops land inside handlers.
const HANDLE_FOR: Duration = Duration::from_millis(400);
/// How long stops are started for.
const WINDOW: Duration = Duration::from_secs(52);
const MIN_STOPS: usize = 50;
/// Tolerance of the lease-end comparison (the worker reads the lease end from its consumer's published status).
const SLACK_US: u64 = 20_000;

/// One stop, as the test did it.
#[derive(Debug, Clone)]
struct Stop {
    pid: u32,
    stopped_us: u64,
    resumed_us: u64,
    replaced: bool,
}

struct Env {
    coordinators: String,
    redis: String,
    stream: String,
    group: String,
    dir: PathBuf,
}

impl Env {
    fn spawn(&self, member: &str, incarnation: usize) -> Child {
        let worker = StallWorker {
            coordinators: self.coordinators.clone(),
            redis: self.redis.clone(),
            stream: self.stream.clone(),
            group: self.group.clone(),
            handle: HANDLE_FOR,
            read_failure: None,
        };
        worker.spawn(member, &self.dir, &format!("{member}.{incarnation}"))
    }
}

/// Handlers of `pid` started and neither completed nor dropped, as recorded so far.
fn open_handlers(records: &[Record], pid: u32, before_us: u64) -> usize {
    let key = |r: &Record| (r.shard, r.entry, r.start_us);
    let finished: std::collections::BTreeSet<_> = records
        .iter()
        .filter(|r| r.pid == pid && r.kind != Kind::Start && r.at_us <= before_us)
        .map(key)
        .collect();
    records
        .iter()
        .filter(|r| r.pid == pid && r.kind == Kind::Start && r.start_us <= before_us)
        .filter(|r| !finished.contains(&key(r)))
        .count()
}

/// A deterministic spread of run times (no two workers in lockstep).
fn run_time(worker: usize, round: usize) -> Duration {
    let x = (worker as u64 * 7919 + round as u64 * 104_729) % 800;
    Duration::from_millis(700 + x)
}

/// Stops one worker again and again until `until`; returns its stops. A replaced worker gets a new process with
/// the same member id during each stop, and the old one is killed after it was resumed.
async fn stop_loop(env: Arc<Env>, worker: usize, replaced: bool, until: Instant) -> Vec<Stop> {
    let member = format!("w{worker}");
    let mut incarnation = 0;
    let mut child = env.spawn(&member, incarnation);
    let mut stops = Vec::new();
    let mut round = 0;
    while Instant::now() + STOP_FOR < until {
        round += 1;
        // Real time: the worker runs for a while between two stops, as a process between two stalls.
        tokio::time::sleep(run_time(worker, round)).await;
        // Stop only with handlers in flight.
        let pid = child.id();
        let busy = test_support::poll_until(Duration::from_secs(5), || {
            let open = open_handlers(&read_records(&env.dir), pid, wall_us());
            async move { open > 0 }
        })
        .await;
        if !busy {
            continue;
        }
        signal(pid, "STOP");
        let stopped_us = wall_us();
        // The handler seen open may have finished between that look and the signal (a loaded machine widens the
        // gap): the stopped process writes nothing more, so its records now say whether the stop landed inside
        // a handler. If not, it is resumed at once and not counted (a stop of a few milliseconds), and tried again.
        if open_handlers(&read_records(&env.dir), pid, stopped_us) == 0 {
            signal(pid, "CONT");
            continue;
        }
        let mut replacement = None;
        // Real time: the process stays stopped for STOP_FOR, longer than its lease, on every clock involved (its
        // replacement starts 300 ms into the stop).
        if replaced {
            tokio::time::sleep(Duration::from_millis(300)).await;
            incarnation += 1;
            replacement = Some(env.spawn(&member, incarnation));
            tokio::time::sleep(STOP_FOR - Duration::from_millis(300)).await;
        } else {
            tokio::time::sleep(STOP_FOR).await;
        }
        // Taken before the signal: whatever completes after it completed after the resume.
        let resumed_us = wall_us();
        signal(pid, "CONT");
        stops.push(Stop {
            pid,
            stopped_us,
            resumed_us,
            replaced,
        });
        if let Some(next) = replacement {
            // The resumed process runs whatever it had in hand (every handler it started ends or is dropped)
            // before it is killed; one that never ends is killed at the deadline.
            test_support::poll_until(Duration::from_secs(2), || {
                let open = open_handlers(&read_records(&env.dir), pid, wall_us());
                async move { open == 0 }
            })
            .await;
            let _ = child.kill();
            let _ = child.wait();
            child = next;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    stops
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_workers_never_complete_a_handler_after_their_lease_and_no_shard_has_two_owners_at_once() {
    let s = Scenario::start("stalls", SHARDS).await;
    let dir = records_dir("stall-test");
    let env = Arc::new(Env {
        coordinators: s.urls().join(","),
        redis: s.redis.url(),
        stream: s.stream.to_string(),
        group: s.group.to_string(),
        dir: dir.clone(),
    });
    let history = History::new();
    let producer = Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer, &history, Duration::from_millis(25), 48);

    let until = Instant::now() + WINDOW;
    let loops: Vec<_> = (0..PLAIN_WORKERS + REPLACED_WORKERS)
        .map(|w| tokio::spawn(stop_loop(Arc::clone(&env), w, w >= PLAIN_WORKERS, until)))
        .collect();
    let mut stops = Vec::new();
    for l in loops {
        stops.extend(l.await.expect("stop loop"));
    }
    publisher.stop().await;

    let records = read_records(&dir);
    let report = analyse(&records, &stops);
    let overlaps = report.completed.check();
    println!("{report}two owners at overlapping times (or a start outside the lease): {overlaps}");
    assert!(report.stops >= MIN_STOPS, "only {} stops", report.stops);
    assert!(
        report.stops_with_in_flight == report.stops,
        "every stop has handlers in flight: {report}"
    );
    assert_eq!(report.late_by_lease, 0, "completions after the lease end: {report}");
    assert_eq!(
        report.late_across_stop, 0,
        "completions after a stop longer than the lease: {report}"
    );
    assert!(overlaps.is_ok(), "{overlaps}");
    let _ = std::fs::remove_dir_all(&dir);
}

struct Analysis {
    stops: usize,
    replaced_stops: usize,
    stops_with_in_flight: usize,
    in_flight_at_stops: usize,
    completions: usize,
    late_by_lease: usize,
    late_across_stop: usize,
    dropped: usize,
    examples: Vec<String>,
    /// Completed handlings as a history (one "member" per process), for the overlap rule.
    completed: History,
}

impl std::fmt::Display for Analysis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "stall test: {} stops ({} with a replacement), {} with handlers in flight, {} handlers in flight at the \
             stops; {} completions, {} dropped handlers; late completions: {} after the lease end, {} across a stop",
            self.stops,
            self.replaced_stops,
            self.stops_with_in_flight,
            self.in_flight_at_stops,
            self.completions,
            self.dropped,
            self.late_by_lease,
            self.late_across_stop
        )?;
        for e in self.examples.iter().take(10) {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

fn analyse(records: &[Record], stops: &[Stop]) -> Analysis {
    let mut by_pid: BTreeMap<u32, Vec<&Stop>> = BTreeMap::new();
    for stop in stops {
        by_pid.entry(stop.pid).or_default().push(stop);
    }
    let starts: BTreeMap<(u32, u32, stream_consumer::EntryId, u64), &Record> = records
        .iter()
        .filter(|r| r.kind == Kind::Start)
        .map(|r| ((r.pid, r.shard, r.entry, r.start_us), r))
        .collect();
    let completed = History::new();
    let (mut late_by_lease, mut late_across_stop) = (0, 0);
    let mut examples = Vec::new();
    let ends: Vec<&Record> = records.iter().filter(|r| r.kind == Kind::End).collect();
    for end in &ends {
        if end.lease_end_us.is_none_or(|lease| end.at_us > lease + SLACK_US) {
            late_by_lease += 1;
            examples.push(format!("late after its lease end: {end}"));
        }
        let across = by_pid
            .get(&end.pid)
            .into_iter()
            .flatten()
            .find(|stop| end.start_us < stop.stopped_us && end.at_us > stop.resumed_us);
        if let Some(stop) = across {
            late_across_stop += 1;
            examples.push(format!(
                "completed {} ms after SIGCONT, started before a {} ms stop: {end}",
                (end.at_us - stop.resumed_us) / 1000,
                (stop.resumed_us - stop.stopped_us) / 1000
            ));
        }
        let start = starts.get(&(end.pid, end.shard, end.entry, end.start_us));
        completed.record_handled(Handled {
            member: format!("{}#{}", end.member, end.pid),
            shard: end.shard,
            entry: end.entry,
            key: None,
            delivery: 1,
            started: wall_us_as_instant(end.start_us),
            ended: wall_us_as_instant(end.at_us),
            started_wall: std::time::UNIX_EPOCH + Duration::from_micros(end.start_us),
            lease_until: start.and_then(|s| s.lease_end_us).map(wall_us_as_instant),
            ok: true,
        });
    }
    let in_flight: Vec<usize> = stops
        .iter()
        .map(|stop| open_handlers(records, stop.pid, stop.stopped_us))
        .collect();
    Analysis {
        stops: stops.len(),
        replaced_stops: stops.iter().filter(|s| s.replaced).count(),
        stops_with_in_flight: in_flight.iter().filter(|n| **n > 0).count(),
        in_flight_at_stops: in_flight.iter().sum(),
        completions: ends.len(),
        late_by_lease,
        late_across_stop,
        dropped: records.iter().filter(|r| r.kind == Kind::Dropped).count(),
        examples,
        completed,
    }
}
