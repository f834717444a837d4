//! Exhaustive model check of a stream's routing against a Redis that forgets (issue 30): the real routing
//! decisions (`routing_section::{grow, restore}`, `state_machine::routing::{plan, answer}`) with producers routing
//! keys by jump hash, and Redis losing writes (a failover on one node, the routing's master and a shard's master
//! failing over independently on a Cluster, an operator restoring a snapshot). See docs/model-check.md, "A routing
//! that regresses".
//!
//! The same explorer as [`super::check`]: breadth first, states deduplicated by a 64-bit fingerprint of their
//! `Debug` form, the shortest path to a violation replayed so each step prints what it did. Every state is checked
//! ([`RoutingWorld::check`]), and every state reached (or every n-th) is followed by the fair suffix
//! ([`RoutingWorld::settle`]).
//!
//! Sizes come from [`RoutingConfig::from_env`]: the CI configurations by default, deeper runs with
//! `ROUTING_CHECK_DEPTH`, `ROUTING_CHECK_BUDGET`, `ROUTING_CHECK_PRODUCERS`, `ROUTING_CHECK_GROW`,
//! `ROUTING_CHECK_SUFFIX_EVERY`, `ROUTING_CHECK_CLOCK_GAP`, `ROUTING_CHECK_SHARD_NODES` (`MODEL_CHECK_PROGRESS=1`
//! prints every layer).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hasher};
use std::time::Instant;

use super::routing_world::{describe, Action, RoutingBudget, RoutingConfig, RoutingWorld};
use crate::state_machine::model::{Counterexample, Report};

impl RoutingConfig {
    /// The first configuration the test suite runs: one Redis node that fails over once (losing what its
    /// replica had not copied) and is restored once from an older snapshot by a restart, two producers, two keys,
    /// two growths by one shard, three writes, and one routing section that stops between its writes. Losses
    /// fall between sections only, and a snapshot is restored only when no failover came after it: the defects
    /// that lie beyond those bounds have tests of their own (below).
    pub fn ci_node() -> RoutingConfig {
        RoutingConfig {
            producers: 2,
            keys: 2,
            shards: 1,
            max_grow: 1,
            depth: 9,
            cluster: false,
            shard_nodes: 0,
            clock_gap: 1_000,
            budget: RoutingBudget {
                growths: 2,
                writes: 3,
                failovers: 1,
                restores: 1,
                abandons: 1,
                ..RoutingBudget::NONE
            },
            suffix_every: 1,
            availability: true,
            mid_section_loss: false,
            restore_keeps_run_id: false,
            restore_across_loss: false,
            documented_limits: false,
        }
    }

    /// The second: a Cluster, where the routing hash's master and any one shard's master fail over
    /// independently. The documented Cluster limit (a parent's master that loses its seal) is accepted;
    /// availability is required (a child's master that loses its record was a defect, fixed by the record sweep).
    pub fn ci_cluster() -> RoutingConfig {
        RoutingConfig {
            cluster: true,
            shard_nodes: !0,
            depth: 8,
            budget: RoutingBudget {
                growths: 2,
                writes: 3,
                failovers: 1,
                shard_failovers: 1,
                ..RoutingBudget::NONE
            },
            availability: true,
            documented_limits: true,
            ..RoutingConfig::ci_node()
        }
    }

    /// `base`, overridden by the environment (see the module doc).
    pub fn from_env(base: RoutingConfig) -> RoutingConfig {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let mut c = base;
        if let Some(d) = var("ROUTING_CHECK_DEPTH") {
            c.depth = d as usize;
        }
        if let Some(p) = var("ROUTING_CHECK_PRODUCERS") {
            c.producers = p.clamp(1, 2) as u8;
        }
        if let Some(g) = var("ROUTING_CHECK_GROW") {
            c.max_grow = g.clamp(1, 3) as u32;
        }
        if let Some(n) = var("ROUTING_CHECK_SUFFIX_EVERY") {
            c.suffix_every = n.max(1) as usize;
        }
        if let Some(g) = var("ROUTING_CHECK_CLOCK_GAP") {
            c.clock_gap = g;
        }
        if let Some(a) = var("ROUTING_CHECK_AVAILABILITY") {
            c.availability = a != 0;
        }
        if let Some(m) = var("ROUTING_CHECK_MID_SECTION_LOSS") {
            c.mid_section_loss = m != 0;
        }
        if let Some(r) = var("ROUTING_CHECK_RESTORE_KEEPS_RUN_ID") {
            c.restore_keeps_run_id = r != 0;
        }
        if let Some(r) = var("ROUTING_CHECK_RESTORE_ACROSS_LOSS") {
            c.restore_across_loss = r != 0;
        }
        if let Some(d) = var("ROUTING_CHECK_DOCUMENTED_LIMITS") {
            c.documented_limits = d != 0;
        }
        if let Some(m) = var("ROUTING_CHECK_SHARD_NODES") {
            c.shard_nodes = m as u32;
        }
        // `ROUTING_CHECK_BUDGET=growths=2,writes=3,failovers=1`: exactly these, none of the others.
        if let Ok(spec) = std::env::var("ROUTING_CHECK_BUDGET") {
            c.budget = parse_budget(&spec);
        }
        c
    }
}

/// `growths=2,writes=3,…` (a kind without a number: 1).
pub fn parse_budget(spec: &str) -> RoutingBudget {
    let mut b = RoutingBudget::NONE;
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, "1"));
        let n: u8 = v.parse().unwrap_or(1).min(6);
        match k.trim() {
            "growths" => b.growths = n,
            "writes" => b.writes = n,
            "failovers" => b.failovers = n,
            "shard_failovers" => b.shard_failovers = n,
            "restores" => b.restores = n,
            "abandons" => b.abandons = n,
            "forgeries" => b.forgeries = n,
            other => panic!("ROUTING_CHECK_BUDGET: unknown kind {other:?}"),
        }
    }
    b
}

fn fingerprint(w: &RoutingWorld) -> u64 {
    struct H(DefaultHasher);
    impl std::fmt::Write for H {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    // Every map in the world is ordered: equal states print equally.
    let mut h = H(DefaultHasher::new());
    std::fmt::write(&mut h, format_args!("{w:?}")).expect("writing to a hasher cannot fail");
    h.0.finish()
}

/// Where a state was first reached.
#[derive(Clone, Copy)]
enum Origin {
    Start,
    Step(u64, Action),
}

/// Explores `config` exhaustively; `Err` holds the shortest counterexample (of a step or a state; one found by
/// the fair suffix is the shortest path to a state whose suffix fails).
pub fn check(config: &RoutingConfig) -> Result<Report, Box<Counterexample>> {
    let started = Instant::now();
    let start = RoutingWorld::new(config);
    let mut origin: HashMap<u64, Origin> = HashMap::new();
    let fp = fingerprint(&start);
    origin.insert(fp, Origin::Start);
    let mut layer = vec![(fp, start.clone())];
    let mut transitions = 0;
    let mut settled = 0;
    let mut seen = 0usize;
    for depth in 0..=config.depth {
        let mut next = Vec::new();
        for (fp, w) in &layer {
            if seen.is_multiple_of(config.suffix_every.max(1)) {
                settled += 1;
                let mut suffix = Vec::new();
                if let Err(v) = w.settle(config, &mut suffix) {
                    return Err(Box::new(counterexample(&start, &origin, *fp, None, v, suffix)));
                }
            }
            seen += 1;
            if depth == config.depth {
                continue;
            }
            for action in w.actions(config) {
                transitions += 1;
                let mut n = w.clone();
                if let Err(v) = n.step(action) {
                    return Err(Box::new(counterexample(
                        &start,
                        &origin,
                        *fp,
                        Some(action),
                        v,
                        Vec::new(),
                    )));
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

fn start_line(w: &RoutingWorld) -> String {
    format!(
        "start: routing {} (records written first), {} producer(s) fetched it, Redis time {}",
        describe(&w.redis.routing.routing),
        w.producers.len(),
        w.now
    )
}

/// Replays the path to `fp` (then `last`, the failing action) from the start, describing every step; `suffix`
/// is what the fair suffix did when it found the violation.
fn counterexample(
    start: &RoutingWorld,
    origin: &HashMap<u64, Origin>,
    fp: u64,
    last: Option<Action>,
    violation: String,
    suffix: Vec<String>,
) -> Counterexample {
    let mut actions: Vec<Action> = last.into_iter().collect();
    let mut at = fp;
    while let Origin::Step(parent, action) = origin[&at] {
        actions.push(action);
        at = parent;
    }
    actions.reverse();
    let mut w = start.clone();
    let mut trace = vec![start_line(&w)];
    for (i, action) in actions.into_iter().enumerate() {
        match w.step(action) {
            Ok(line) => trace.push(format!("{:>2}. {line}", i + 1)),
            Err(v) => {
                trace.push(format!("{:>2}. {action:?}: VIOLATION", i + 1));
                return Counterexample { violation: v, trace };
            }
        }
    }
    if suffix.is_empty() {
        return Counterexample { violation, trace };
    }
    let suffix: Vec<String> = suffix.into_iter().map(|l| format!("      {l}")).collect();
    Counterexample {
        violation: format!(
            "{violation}\n    after the fair suffix from {}:\n{}",
            w.describe_redis(),
            suffix.join("\n")
        ),
        trace,
    }
}

/// Replays `actions` from the start, checking every step, then the fair suffix.
pub fn replay(config: &RoutingConfig, actions: &[Action]) -> Result<(), String> {
    let mut w = RoutingWorld::new(config);
    println!("{}", start_line(&w));
    for (i, &a) in actions.iter().enumerate() {
        if !w.actions(config).contains(&a) {
            return Err(format!("step {} ({a:?}) is not enabled", i + 1));
        }
        match w.step(a) {
            Ok(line) => println!("{:>2}. {line}", i + 1),
            Err(v) => return Err(format!("step {} ({a:?}): {v}", i + 1)),
        }
    }
    let mut suffix = Vec::new();
    let r = w.settle(config, &mut suffix);
    for line in suffix {
        println!("    {line}");
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::model::{inject, Bug};

    fn run(config: &RoutingConfig) -> Result<Report, Box<Counterexample>> {
        let r = check(config);
        match &r {
            Ok(report) => println!(
                "routing check {} depth {} producers {} grow<={} budget {:?}: {} states, {} transitions, {} suffixes, {:.1} s",
                if config.cluster { "cluster" } else { "one node" },
                config.depth,
                config.producers,
                config.max_grow,
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

    #[test]
    fn routing_check_holds_on_one_node() {
        let config = RoutingConfig::from_env(RoutingConfig::ci_node());
        if let Err(c) = run(&config) {
            panic!("{c}");
        }
    }

    #[test]
    fn routing_check_holds_on_a_cluster() {
        let config = RoutingConfig::from_env(RoutingConfig::ci_cluster());
        if let Err(c) = run(&config) {
            panic!("{c}");
        }
    }

    /// The producers' record check matters: without it a producer holding a growth Redis lost (one node, a
    /// failover) writes a moved key into the child before the restoration seals the parent, so groups read a
    /// later write of the key (in the parent, up to the seal) before an earlier one (in the child).
    #[test]
    fn routing_check_finds_a_producer_that_writes_into_a_shard_without_its_record() {
        inject(Bug::PublishWithoutRecordCheck);
        let config = RoutingConfig {
            budget: parse_budget("growths=1,writes=2,failovers=1"),
            ..RoutingConfig::ci_node()
        };
        let c = run(&config).expect_err("the injected bug is found");
        assert!(c.violation.contains("groups read them in the other order"), "{c}");
        assert!(c.trace.iter().any(|l| l.contains("failover")), "{c}");
    }

    /// A report is never evidence (issue "Redis is the evidence"): with a hostile client that reports a version
    /// and a shard count nobody issued, before and after a failover, the routing holds every property.
    #[test]
    fn routing_check_holds_with_a_client_that_forges_reports() {
        let config = RoutingConfig {
            budget: parse_budget("growths=1,writes=2,failovers=1,forgeries=1"),
            ..RoutingConfig::ci_node()
        };
        if let Err(c) = run(&config) {
            panic!("{c}");
        }
    }

    /// The coordinator before "Redis is the evidence" believed a report once per history of the routing hash:
    /// after a failover (a new run id) one forged fetch grew the stream to the reported count.
    #[test]
    fn routing_check_finds_a_coordinator_that_believes_reports() {
        inject(Bug::BelieveReports);
        let config = RoutingConfig {
            budget: parse_budget("growths=1,failovers=1,forgeries=1"),
            ..RoutingConfig::ci_node()
        };
        let c = run(&config).expect_err("the injected bug is found");
        assert!(c.violation.contains("a client's report was believed"), "{c}");
        assert!(c.trace.iter().any(|l| l.contains("failover")), "{c}");
    }

    /// Retiring versions matters: a version one above the stored one after a failover names a second layout.
    #[test]
    fn routing_check_finds_a_version_retired_from_the_stored_one() {
        inject(Bug::RetireFromStored);
        let config = RoutingConfig {
            budget: parse_budget("growths=1,failovers=1"),
            ..RoutingConfig::ci_node()
        };
        let c = run(&config).expect_err("the injected bug is found");
        assert!(c.violation.contains("names two layouts"), "{c}");
    }

    /// Found by a deeper Cluster run once the records held counts (depth 11 of
    /// `ROUTING_CHECK_BUDGET=growths=2,writes=2,failovers=1,shard_failovers=2` with availability): the routing's
    /// master loses a growth, the tick retires the version (one shard, shard 0's fence and count with it), then
    /// shard 0's master loses that seal and keeps the lost growth's (v2, 2 shards). The count refused the
    /// retired layout's producers there for good. Fixed by the tick's sweep, which lowers a record's counts to
    /// the routing's where it names more shards at or below the routing's version (`store::reshard::RECOUNT`).
    #[test]
    fn a_retirement_seal_lost_on_a_cluster_leaves_no_shard_refusing_the_routing() {
        use Action::*;
        let config = RoutingConfig {
            budget: parse_budget("growths=2,writes=2,failovers=1,shard_failovers=2"),
            ..RoutingConfig::ci_cluster()
        };
        let path = [
            Grow(1),
            LagRouting,
            LagShard(0),
            LagShard(1),
            Records,
            Commit,
            FailoverRouting,
            FailoverShard(1),
            Tick,
            Commit,
            FailoverShard(0),
        ];
        holds(&config, &path);
        inject(Bug::SweepWithoutRecount);
        finds(
            &config,
            &path,
            "cannot publish a to shard 0: fenced: fence v2 of 2 shards",
        );
    }

    /// Found by the same run (depth 12), older than the counts: growths 1 -> 2 -> 3, the routing's master loses
    /// the second, shard 0's master loses its seal of it, shard 2's master its record. Only shard 1's fence (v3)
    /// still says a growth was lost, and the tick read shard 0's fence alone: shard 1 refused the stored v2 for
    /// good. Fixed: the tick's sweep reads every listed shard's fence (64 per tick in the shell) and a fence above
    /// the routing restores it past that fence.
    #[test]
    fn a_fence_above_the_routing_on_any_listed_shard_restores_it() {
        use Action::*;
        let config = RoutingConfig {
            budget: parse_budget("growths=2,writes=2,failovers=1,shard_failovers=2"),
            ..RoutingConfig::ci_cluster()
        };
        let path = [
            Grow(1),
            Records,
            Commit,
            LagRouting,
            LagShard(0),
            Grow(1),
            LagShard(2),
            Records,
            Commit,
            FailoverRouting,
            FailoverShard(0),
            FailoverShard(2),
        ];
        holds(&config, &path);
        inject(Bug::SweepIgnoresFences);
        finds(&config, &path, "fenced: fence 3 above v2");
    }

    /// Replays `actions`; the violation it finds must contain `expected`.
    fn holds(config: &RoutingConfig, actions: &[Action]) {
        if let Err(v) = replay(config, actions) {
            panic!("the path breaks a property again: {v}");
        }
    }

    fn finds(config: &RoutingConfig, actions: &[Action], expected: &str) {
        let v = replay(config, actions).expect_err("the path still breaks a property (an open defect)");
        println!("violated: {v}");
        assert!(v.contains(expected), "{v}");
    }

    /// Defect 1 (one node), fixed. A failover while add-shards is between its seal and its commit: the promoted
    /// replica lacks the seal (or the child's record), but the routing hash is unchanged, so the commit's
    /// compare-and-set passes and commits a growth whose parent is unfenced (producers of the old layout write
    /// moved keys into it after the recorded seal) or whose child has no record (fenced producers were refused
    /// there for good). Found at depth 4 (and the record's variant at depth 4 with availability). Both fixed: the
    /// record's variant by the tick's record sweep, the seal's by `COMMIT`, which refuses a decision loaded from
    /// another server (run id) as a conflict; the section loads again, sees the new run id, retires the version
    /// and seals again.
    #[test]
    fn a_failover_inside_a_growth_commits_it_without_its_seal_or_record() {
        use Action::*;
        let config = RoutingConfig {
            mid_section_loss: true,
            ..RoutingConfig::ci_node()
        };
        holds(&config, &[Lag, Grow(1), Failover, Publish(0, 0)]);
        // The record's variant is fixed: the tick's record sweep writes the lost child record again.
        let available = RoutingConfig {
            availability: true,
            ..config
        };
        holds(&available, &[Grow(1), Lag, Records, Failover]);
    }

    /// Defect 2 (Cluster), fixed: the master of a growth's child fails over after the routing was committed and
    /// loses the child's record: the routing lists the shard, fenced producers were refused there for good (no
    /// record). Found at depth 5; the tick's record sweep (`Coordinator::sweep_records`) now writes the record
    /// again from the routing, and the path holds to the end, fair suffix included.
    #[test]
    fn a_child_whose_master_lost_its_record_refuses_producers_for_good() {
        use Action::*;
        let config = RoutingConfig {
            availability: true,
            ..RoutingConfig::ci_cluster()
        };
        holds(&config, &[Grow(1), LagShard(1), Records, Commit, FailoverShard(1)]);
    }

    /// Defect 3 (Cluster), fixed: a written shard stranded. Growths 1 -> 2 -> 3; P0 saw 2 shards, P1 saw 3 and
    /// wrote key a to shard 2. The routing's master loses both growths, shard 1's master loses shard 1's record.
    /// The probe stopped at the missing record, so only shard 0's fence and the reports were evidence: the tick
    /// retired the version (one shard), P0's report restored 2 shards and settled the reports; shard 2's record
    /// (born at v3, below the retired version) was never believed, nor P1's report of 3 shards. Found at depth 13
    /// with `ROUTING_CHECK_SHARD_NODES=2 ROUTING_CHECK_BUDGET=growths=2,writes=1,failovers=1,shard_failovers=1`
    /// (23,961 states, under a second in release). Fixed: shard 0's `fenceCount` (3: the last layout that sealed
    /// it) makes the probe read past the gap; shard 2's record names its growth (2 -> 3), so the first
    /// restoration brings back 1 -> 2 as a new growth (shard 1's record written again) and then 2 -> 3.
    #[test]
    fn a_record_gap_no_longer_strands_a_written_shard() {
        use Action::*;
        let config = RoutingConfig {
            shard_nodes: 0b10,
            ..RoutingConfig::ci_cluster()
        };
        holds(
            &config,
            &[
                Grow(1),
                LagRouting,
                LagShard(1),
                Records,
                Commit,
                Refresh(0),
                Grow(1),
                Records,
                Commit,
                Refresh(1),
                Publish(1, 0),
                FailoverRouting,
                FailoverShard(1),
            ],
        );
    }

    /// Defect 4 (one node), fixed. An operator restores a snapshot into the running Redis (same run id, as
    /// docs/failure-handling.md lists for group metadata): nothing tells the coordinator numbers were lost, so
    /// the next add-shards takes the stored version + 1 again, with another count, and a producer still holding
    /// the lost v2 (2 shards) wrote by a layout v2 no longer meant, past every fence (they compared numbers).
    /// Found at depth 6 with growths of up to 2 shards. Fixed by the counts in the shards' records
    /// (`fenceCount`, `bornCount`): with jump consistent hashing a layout is its shard count, and a producer with
    /// fewer shards than the record's is refused, so the reused number places no key. The number itself may
    /// still be issued again (the commit-time property 2 forgets numbers lost where the coordinator cannot see
    /// it); without the count check the lost layout's write breaks the order again.
    #[test]
    fn a_restore_that_keeps_the_run_id_issues_a_version_again_but_no_write_follows_the_lost_layout() {
        use Action::*;
        let config = RoutingConfig {
            max_grow: 2,
            restore_keeps_run_id: true,
            ..RoutingConfig::ci_node()
        };
        // Key b is on shard 0 with 2 shards and moves to shard 2 with 3: P0 routes it by the lost v2 (2 shards).
        let path = [
            Backup,
            Grow(1),
            Records,
            Commit,
            Refresh(0),
            Restore,
            Grow(2),
            Records,
            Commit,
            Publish(0, 1),
            Publish(0, 0),
        ];
        holds(&config, &path);
        inject(Bug::PublishWithoutCountCheck);
        finds(
            &config,
            &path,
            "an entry of b written with v2/2 shards is on shard 0, but v2 means 3 shards",
        );
    }

    /// Defect 5 (one node, two losses), fixed. A failover loses a growth whose parent kept its fence; the tick
    /// retires the version (v2000, one shard) and a producer adopts it. An operator then restores a snapshot
    /// taken before the failover (the growth, v2, is back). The producer's lost version is above every fence of
    /// the restored Redis, so it wrote key a into parent 0 by its one-shard layout, after v2's seal. Found at
    /// depth 11 (1.65 million states through depth 10, release). Fixed by the counts: parent 0's fence says v2
    /// had 2 shards, and the producer's v2000 has 1, so it is refused, refreshes (reporting v2000) and routes
    /// by the restored layout.
    #[test]
    fn a_restore_to_before_a_failover_refuses_the_lost_higher_version() {
        use Action::*;
        let config = RoutingConfig {
            restore_across_loss: true,
            ..RoutingConfig::ci_node()
        };
        let path = [
            Grow(1),
            Lag,
            Records,
            Commit,
            Backup,
            Failover,
            Tick,
            Commit,
            Refresh(0),
            Restore,
            Publish(0, 0),
        ];
        holds(&config, &path);
        inject(Bug::PublishWithoutCountCheck);
        finds(&config, &path, "written by P0 with v2000/1 shards into parent 0");
    }
}
