//! Driving many simulated members: one call each as fast as `concurrency` callers go (joins, convergence), or
//! each at its own heartbeat interval for a window (the steady state).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio::time::MissedTickBehavior;

use super::member::{Beat, SimMember, Target};

/// A member of a driven population: its group and its state.
pub struct Driven {
    /// Where it beats.
    pub target: Arc<Target>,
    /// Its request state.
    pub member: Mutex<SimMember>,
}

/// Counts of one pass or window.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Answered calls.
    pub answered: u64,
    /// Refused calls (the member joins again next time).
    pub rejected: u64,
    /// Failed calls.
    pub failed: u64,
    /// Latency of every call, sorted.
    pub latencies: Vec<Duration>,
    /// Wall time.
    pub elapsed: Duration,
}

impl Tally {
    /// Every call made.
    pub fn calls(&self) -> u64 {
        self.answered + self.rejected + self.failed
    }

    fn add(&mut self, beat: Beat, took: Duration) {
        match beat {
            Beat::Answered => self.answered += 1,
            Beat::Rejected => self.rejected += 1,
            Beat::Failed => self.failed += 1,
        }
        self.latencies.push(took);
    }

    fn merge(&mut self, other: Tally) {
        self.answered += other.answered;
        self.rejected += other.rejected;
        self.failed += other.failed;
        self.latencies.extend(other.latencies);
    }
}

/// One call of every member, `concurrency` at a time.
pub async fn pass(members: &Arc<Vec<Driven>>, concurrency: usize) -> Tally {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (members, next) = (members.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(d) = members.get(i) else { break };
                let mut m = d.member.lock().await;
                let (beat, took) = d.target.beat(&mut m).await;
                tally.add(beat, took);
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for t in tasks {
        total.merge(t.await.expect("pass worker"));
    }
    total.latencies.sort();
    total.elapsed = started.elapsed();
    total
}

/// Every member beats every `interval`, the members spread evenly over it, for `window`. A member whose call
/// takes longer than its interval beats again as soon as it returns (no burst to catch up), so the rate reached is
/// what the coordinator sustains when it cannot take the rate offered. No call starts after `window`; the tally's
/// `elapsed` is `window`, or longer when the last call ended after it.
pub async fn steady(members: &Arc<Vec<Driven>>, interval: Duration, window: Duration) -> Tally {
    let started = Instant::now();
    // A member whose next beat falls after the window stops at its end, not at that beat: what is counted
    // between the call's start and end is divided by the window.
    let end = tokio::time::Instant::now() + window;
    let n = members.len().max(1);
    let mut tasks = Vec::with_capacity(n);
    for i in 0..members.len() {
        let members = members.clone();
        tasks.push(tokio::spawn(async move {
            let d = &members[i];
            let first = tokio::time::Instant::now() + interval.mul_f64(i as f64 / n as f64);
            let mut tick = tokio::time::interval_at(first, interval);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut tally = Tally::default();
            loop {
                if tokio::time::timeout_at(end, tick.tick()).await.is_err() || started.elapsed() >= window {
                    break;
                }
                let mut m = d.member.lock().await;
                let (beat, took) = d.target.beat(&mut m).await;
                tally.add(beat, took);
                tally.elapsed = started.elapsed();
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for t in tasks {
        total.merge(t.await.expect("member task"));
    }
    total.latencies.sort();
    // The whole call: the window and the beats still answering at its end.
    total.elapsed = started.elapsed();
    total
}

/// Load average (1, 5, 15 min) as printed by `/proc/loadavg`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Beats, in the background, every member in the group whose last answer is older than `interval`, until
/// [`KeepAlive::stop`]: while a long join pass runs, the members that joined first must not outlive their TTL.
pub struct KeepAlive {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
}

impl KeepAlive {
    /// Starts `workers` keepers over `members`.
    pub fn start(members: &Arc<Vec<Driven>>, interval: Duration, workers: usize) -> KeepAlive {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = workers.max(1);
        let tasks = (0..workers)
            .map(|w| {
                let (members, stop) = (members.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut beats = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let mut idle = true;
                        for d in members.iter().skip(w).step_by(workers) {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            // A member the pass holds is being beaten anyway.
                            let Ok(mut m) = d.member.try_lock() else { continue };
                            if m.is_member() && m.last_answer.is_some_and(|t| t.elapsed() >= interval) {
                                d.target.beat(&mut m).await;
                                beats += 1;
                                idle = false;
                            }
                        }
                        if idle {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    beats
                })
            })
            .collect();
        KeepAlive { stop, tasks }
    }

    /// Stops the keepers; the heartbeats they sent.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut beats = 0;
        for t in self.tasks {
            beats += t.await.unwrap_or(0);
        }
        beats
    }
}

/// A progress line on stderr (the figures go to stdout), with the time since `since`.
pub fn progress(since: Instant, what: &str) {
    eprintln!("[{:>7.1} s] {what}", since.elapsed().as_secs_f64());
}
