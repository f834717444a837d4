//! Exhaustive model check of the real coordinator core and the real client rules (see docs/model-check.md).
//!
//! A breadth-first explorer over [`world::World`]: every state reachable within `depth` actions from the warm
//! start states is visited once (states are deduplicated by a 64-bit fingerprint of their full contents), every
//! step and every state is checked against the safety properties, and every state at the depth bound is
//! followed by a fair, fault-free suffix that must settle the assignment (liveness). A violation is reported
//! with the shortest path to it (breadth first), replayed from the start so each step prints what it did.
//!
//! Sizes come from [`Config::from_env`]: the CI configurations by default, deeper runs with
//! `MODEL_CHECK_DEPTH`, `MODEL_CHECK_MEMBERS`, `MODEL_CHECK_SHARDS`, `MODEL_CHECK_FAULTS`, `MODEL_CHECK_NET`
//! and `MODEL_CHECK_LIVENESS_EVERY` (`MODEL_CHECK_PROGRESS=1` prints every layer).

mod config;
mod parts;
mod properties;
mod world;

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hasher};
use std::time::Instant;

pub use config::Config;
use parts::{Action, Budget};
use world::World;

/// A known bug the checker must find, switched on only in this crate's tests (see [`inject`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// A REVOKED ack in a request sent before the drain instruction (its client stopped when its lease ran out,
    /// then read the shard again) releases the shard: fixed by `revoke_since_version`.
    LateRevokedAck,
    /// Members whose lease ran out are never expired: a crashed member keeps its shards (liveness).
    NoExpiry,
    /// The routing check's producers write into a shard without its record (the fence alone is checked).
    PublishWithoutRecordCheck,
    /// The routing check's producers are not refused for a layout with fewer shards than the record's
    /// `fenceCount` / `bornCount` (versions alone are compared).
    PublishWithoutCountCheck,
    /// The tick's sweep leaves a record's counts as they are (no `store::reshard::RECOUNT`).
    SweepWithoutRecount,
    /// The tick's sweep ignores the fences it reads (only shard 0's fence says a growth was lost).
    SweepIgnoresFences,
    /// A routing version retired after a loss is only one above the stored one: `routing::retired` trusts the
    /// lower stored value over the fence, the report and Redis time.
    RetireFromStored,
    /// A client's report of a higher routing version or shard count restores a growth to the reported count, as
    /// the coordinator did before "Redis is the evidence": a forged report grows the stream.
    BelieveReports,
    /// The tick gives up before the safety sweep when it cannot read the due index, as it did before issue 39: a
    /// damaged index stops every expiry.
    TickStopsOnDamagedIndex,
}

thread_local! {
    static INJECTED: Cell<Option<Bug>> = const { Cell::new(None) };
}

/// Whether `bug` is switched on (on this thread; tests only).
pub fn injected(bug: Bug) -> bool {
    INJECTED.with(Cell::get) == Some(bug)
}

/// Switches `bug` on for the rest of this thread (one test, as nextest runs each test in its own process).
pub fn inject(bug: Bug) {
    INJECTED.with(|b| b.set(Some(bug)));
}

/// What a run explored.
#[derive(Debug)]
pub struct Report {
    pub states: usize,
    pub transitions: usize,
    pub settled: usize,
    pub seconds: f64,
}

/// A property violation and the path to it.
#[derive(Debug)]
pub struct Counterexample {
    pub violation: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Counterexample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "counterexample ({} steps):", self.trace.len().saturating_sub(1))?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(f, "violated: {}", self.violation)
    }
}

fn fingerprint(w: &World) -> u64 {
    struct H(DefaultHasher);
    impl std::fmt::Write for H {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    // The Debug form covers every field, and every map in it is ordered: equal states give equal text.
    let mut h = H(DefaultHasher::new());
    std::fmt::write(&mut h, format_args!("{w:?}")).expect("writing to a hasher cannot fail");
    h.0.finish()
}

/// Where a state was first reached: its parent and the action, or the start state it is.
#[derive(Clone, Copy)]
enum Origin {
    Start(usize),
    Step(u64, Action),
}

/// Explores `config` exhaustively; `Err` holds the shortest counterexample.
pub fn check(config: &Config) -> Result<Report, Box<Counterexample>> {
    let started = Instant::now();
    // Two warm starts: every member running and settled; and all but the last, which has yet to start (a join
    // and a handover ahead).
    let starts: Vec<World> = [config.members, config.members - 1]
        .into_iter()
        .filter(|&n| n > 0)
        .map(|n| World::new(config, n))
        .collect();
    let mut origin: HashMap<u64, Origin> = HashMap::new();
    let mut layer: Vec<(u64, World)> = Vec::new();
    for (i, w) in starts.iter().enumerate() {
        let fp = fingerprint(w);
        if origin.insert(fp, Origin::Start(i)).is_none() {
            layer.push((fp, w.clone()));
        }
    }
    let mut transitions = 0;
    let mut settled = 0;
    for depth in 0..=config.depth {
        let mut next = Vec::new();
        for (n, (fp, w)) in layer.iter().enumerate() {
            if depth == config.depth {
                if config.liveness && n % config.liveness_every.max(1) == 0 {
                    settled += 1;
                    if let Err(v) = w.settle() {
                        return Err(Box::new(counterexample(&starts, &origin, *fp, None, v)));
                    }
                }
                continue;
            }
            for action in w.actions(config) {
                transitions += 1;
                let mut n = w.clone();
                if let Err(v) = n.step(action) {
                    return Err(Box::new(counterexample(&starts, &origin, *fp, Some(action), v)));
                }
                let nfp = fingerprint(&n);
                if let std::collections::hash_map::Entry::Vacant(e) = origin.entry(nfp) {
                    e.insert(Origin::Step(*fp, action));
                    next.push((nfp, n));
                }
            }
        }
        if std::env::var_os("MODEL_CHECK_PROGRESS").is_some() {
            eprintln!(
                "depth {}: {} new states, {} in all, {:.1} s",
                depth + 1,
                next.len(),
                origin.len(),
                started.elapsed().as_secs_f64()
            );
        }
        layer = next;
    }
    Ok(Report {
        states: origin.len(),
        transitions,
        settled,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Replays the path to `fp` (then `last`, the failing action) from its start state, describing every step.
fn counterexample(
    starts: &[World],
    origin: &HashMap<u64, Origin>,
    fp: u64,
    last: Option<Action>,
    violation: String,
) -> Counterexample {
    let mut actions: Vec<Action> = last.into_iter().collect();
    let mut at = fp;
    let start = loop {
        match origin[&at] {
            Origin::Start(i) => break i,
            Origin::Step(parent, action) => {
                actions.push(action);
                at = parent;
            }
        }
    };
    actions.reverse();
    let mut w = starts[start].clone();
    let running = w.clients.iter().filter(|c| c.membership.is_some()).count();
    let mut trace = vec![format!(
        "start: {running} of {} members running and settled, owners {:?}, v{}, time {}",
        w.clients.len(),
        w.redis
            .meta
            .shards
            .iter()
            .map(|s| s.owner.as_ref().map(|m| m.to_string()))
            .collect::<Vec<_>>(),
        w.redis.meta.metadata_version.0,
        w.now
    )];
    for (i, action) in actions.into_iter().enumerate() {
        match w.step(action) {
            Ok(line) => trace.push(format!("{:>2}. {line}", i + 1)),
            Err(v) => {
                trace.push(format!("{:>2}. {action:?}: VIOLATION", i + 1));
                return Counterexample { violation: v, trace };
            }
        }
    }
    trace.push("then the fair, fault-free suffix (every late request arrives, everyone heartbeats)".to_owned());
    Counterexample { violation, trace }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(config: &Config) -> Result<Report, Box<Counterexample>> {
        let r = check(config);
        match &r {
            Ok(report) => println!(
                "model check {}x{} depth {} net {} faults {:?}: {} states, {} transitions, {} settled, {:.1} s",
                config.members,
                config.shards,
                config.depth,
                config.net_capacity,
                config.budget,
                report.states,
                report.transitions,
                report.settled,
                report.seconds
            ),
            Err(c) => println!("{c}"),
        }
        r
    }

    /// The bounded configurations (overridable for deeper runs, see the module doc and docs/model-check.md).
    #[test]
    fn model_check_holds_with_every_fault_kind() {
        let config = Config::from_env(Config::ci());
        if let Err(c) = run(&config) {
            panic!("{c}");
        }
    }

    #[test]
    fn model_check_holds_under_network_faults_deeper() {
        let config = Config::from_env(Config::ci_network());
        if let Err(c) = run(&config) {
            panic!("{c}");
        }
    }

    #[test]
    fn model_check_finds_the_late_revoked_ack_bug() {
        inject(Bug::LateRevokedAck);
        let mut config = Config::ci();
        config.depth = 10;
        config.net_capacity = 1;
        config.liveness = false;
        config.budget = Budget::NONE;
        let c = run(&config).expect_err("the injected bug is found");
        assert!(c.violation.contains("held under valid leases"), "{c}");
        assert!(c.trace.iter().any(|l| l.contains("late")), "{c}");
    }

    #[test]
    fn model_check_finds_a_group_that_never_expires_a_member() {
        inject(Bug::NoExpiry);
        let mut config = Config::ci();
        config.depth = 1;
        let c = run(&config).expect_err("the injected bug is found");
        assert!(c.violation.contains("liveness"), "{c}");
        assert!(c.trace.iter().any(|l| l.contains("crashes")), "{c}");
    }

    /// Issue 39: a due index of the wrong type made the tick skip itself, sweep included; a crashed member kept its
    /// shards for good.
    #[test]
    fn model_check_finds_a_tick_that_stops_on_a_damaged_due_index() {
        inject(Bug::TickStopsOnDamagedIndex);
        let mut config = Config::ci();
        config.depth = 2;
        config.budget.index_damages = 1;
        let c = run(&config).expect_err("the injected bug is found");
        assert!(c.violation.contains("liveness"), "{c}");
        assert!(c.trace.iter().any(|l| l.contains("due index is damaged")), "{c}");
    }

    /// The tick's visits do not depend on the due index: with it damaged, every property holds.
    #[test]
    fn model_check_holds_with_a_damaged_due_index() {
        let mut config = Config::ci();
        config.budget.index_damages = 1;
        if let Err(c) = run(&config) {
            panic!("{c}");
        }
    }

    #[test]
    fn model_check_holds_with_the_identity_actors() {
        let config = Config::from_env(Config::ci_identity());
        if let Err(c) = run(&config) {
            panic!("{c}");
        }
    }

    /// Replays `actions` from the warm start with `started` processes running, checking every step, then the fair
    /// suffix (liveness).
    fn replay(config: &Config, started: u8, actions: &[Action]) -> Result<(), String> {
        let mut w = World::new(config, started);
        for (i, &a) in actions.iter().enumerate() {
            // The path was found on the code before the fix; where it now takes another turn (a process stopped,
            // a request already answered), the step that no longer applies is skipped.
            if !w.actions(config).contains(&a) {
                println!("{:>2}. {a:?}: not enabled any more, skipped", i + 1);
                continue;
            }
            match w.step(a) {
                Ok(line) => println!("{:>2}. {line}", i + 1),
                Err(v) => return Err(format!("step {} ({a:?}): {v}", i + 1)),
            }
        }
        w.settle()
    }

    fn identity_config() -> Config {
        Config {
            budget: Budget {
                give_backs: 1,
                replacements: 1,
                creeps: 1,
                failovers: 1,
                crashes: 1,
                ..Budget::NONE
            },
            ..Config::ci()
        }
    }

    /// Issue 29, defect 1, as the checker found it at depth 4 (244 states) before incarnations: m0 gives its shards
    /// back and rejoins from the same process; its leave, held in the network, arrives after the rejoin and
    /// removed the rejoined member, whose shard went to m1 while m0 read it.
    #[test]
    fn a_late_leave_does_not_remove_the_rejoin_of_the_same_process() {
        use Action::*;
        let steps = [GiveBack(0), RoundTrip(0), Deliver(0), RoundTrip(1)];
        replay(&identity_config(), 2, &steps).unwrap();
    }

    /// Issue 29, defect 2, as the checker found it at depth 9 (496,112 states through depth 8) before
    /// incarnations: a second process joins as m0 while the first keeps running; a failover loses the join; in the
    /// correction round the coordinator took the second process's higher epoch for m0's, so both read the shards
    /// with the same fencing token.
    #[test]
    fn a_replacement_and_its_predecessor_never_share_a_token() {
        use Action::*;
        let steps = [
            Replace(0),
            RoundTrip(2),
            Failover,
            RoundTrip(2),
            Advance,
            Advance,
            Advance,
            RoundTrip(0),
            RoundTrip(2),
        ];
        replay(&identity_config(), 1, &steps).unwrap();
    }

    /// Issue 29, defect 3, as the checker found it at depth 1 before the reports were settled: a version store
    /// that reports one version above the one it applied opened a correction round after every round.
    #[test]
    fn a_version_no_coordinator_issued_opens_at_most_one_round() {
        replay(&identity_config(), 2, &[Action::Corrupt(0)]).unwrap();
        // And with a failover before it: the coordinator's own evidence opens a round, the reports feed it.
        replay(
            &identity_config(),
            2,
            &[Action::Corrupt(0), Action::Failover, Action::Tick, Action::RoundTrip(0)],
        )
        .unwrap();
    }
}
