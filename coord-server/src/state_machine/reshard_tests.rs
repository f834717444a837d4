//! One test per reshard transition (see `reshard`): grow, seal recording, adoption, seal copies, observations,
//! release, and the Redis-rollback cases (a lost seal or drain is taken again, never skipped).

use protocol::metadata::StreamRouting;
use protocol::names::StreamName;
use protocol::reshard::{EntryId, MAX_RECORDED_GROWTHS};
use protocol::{RoutingVersion, ShardId};

use super::harness::{follow_up, Harness};
use super::reshard::{self, Need, Observation, Seal};
use super::{Event, Input};

fn routing(shards: u32) -> StreamRouting {
    StreamRouting::new(StreamName::new("s").unwrap(), shards, 1_000)
}

fn id(ms: u64) -> EntryId {
    EntryId { ms, seq: 0 }
}

fn seal(v: u64, shard: u32, ms: u64) -> Seal {
    Seal {
        routing_version: RoutingVersion(v),
        shard: ShardId(shard),
        position: id(ms),
    }
}

fn drained(v: u64, shard: u32, ms: u64) -> Observation {
    Observation::Drained {
        routing_version: RoutingVersion(v),
        shard: ShardId(shard),
        seal: id(ms),
    }
}

fn ids(v: &[ShardId]) -> Vec<u32> {
    v.iter().map(|s| s.0).collect()
}

/// A group of 2 shards with one member, and the routing grown to 4 with both parents sealed.
fn grown() -> (Harness, StreamRouting, protocol::messages::HeartbeatResponse) {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let r = reshard::grow(&routing(2), 2);
    let r = reshard::record_seals(&r, &[seal(2, 0, 10), seal(2, 1, 20)]).unwrap();
    h.apply(Input::Tick { routing: Some(&r) });
    (h, r, a)
}

#[test]
fn grow_records_a_growth_with_every_parent_unsealed() {
    let r = reshard::grow(&routing(4), 4);
    assert_eq!((r.routing_version, r.shard_count), (RoutingVersion(2), 8));
    assert_eq!(r.growths.len(), 1);
    let g = &r.growths[0];
    assert_eq!((g.routing_version, g.parents, g.shard_count), (RoutingVersion(2), 4, 8));
    assert_eq!(reshard::unsealed(&r).len(), 4);
    let again = reshard::grow(&r, 8);
    assert_eq!(again.growths.len(), 2);
    assert_eq!(again.growths[1].parents, 8);
    assert_eq!(StreamRouting::decode(again.encode().as_bytes()).unwrap(), again);
}

#[test]
fn grow_keeps_a_bounded_history() {
    let mut r = routing(1);
    for _ in 0..MAX_RECORDED_GROWTHS + 5 {
        r = reshard::grow(&r, 1);
    }
    assert_eq!(r.growths.len(), MAX_RECORDED_GROWTHS);
    assert_eq!(r.growths.last().unwrap().shard_count, r.shard_count);
    assert!(StreamRouting::decode(r.encode().as_bytes()).is_ok());
}

#[test]
fn record_seals_keeps_the_first_seal_and_ignores_unknown_ones() {
    let r = reshard::grow(&routing(2), 2);
    let r1 = reshard::record_seals(&r, &[seal(2, 0, 10)]).unwrap();
    assert_eq!(reshard::unsealed(&r1), vec![(RoutingVersion(2), ShardId(1))]);
    // Sealed again (a coordinator that died before recording, or a retry): the first position stays.
    assert!(reshard::record_seals(&r1, &[seal(2, 0, 99)]).is_none());
    // Not a parent, unknown growth: nothing.
    assert!(reshard::record_seals(&r1, &[seal(2, 3, 5), seal(9, 0, 5)]).is_none());
}

#[test]
fn adoption_holds_children_until_parents_drain() {
    let (mut h, _, a) = grown();
    assert_eq!(h.meta.reshards.len(), 1);
    let r = h.send(&follow_up(&a, &[])).unwrap();
    assert_eq!(ids(&r.assigned), vec![0, 1], "parents are read normally");
    assert_eq!(ids(&r.pending), vec![2, 3], "children are held");
    assert!(
        r.fencing_tokens.iter().all(|t| t.shard.0 < 2),
        "no token for a held child"
    );
    assert_eq!(reshard::parents_not_drained(&h.meta), 2);
    assert!(reshard::is_held_child(&h.meta, ShardId(3)) && !reshard::is_held_child(&h.meta, ShardId(1)));
}

#[test]
fn one_drained_parent_is_not_enough() {
    let (mut h, _, a) = grown();
    let t = h.apply(Input::Reshard(&[drained(2, 0, 10)]));
    assert!(t.events.contains(&Event::ParentDrained {
        version: RoutingVersion(2),
        shard: ShardId(0)
    }));
    let r = h.send(&follow_up(&a, &[])).unwrap();
    assert_eq!(ids(&r.pending), vec![2, 3]);
    assert_eq!(
        reshard::needs(&h.meta),
        vec![Need::Drain {
            routing_version: RoutingVersion(2),
            shard: ShardId(1),
            seal: id(20),
            shard_count: 4
        }]
    );
}

#[test]
fn all_parents_drained_releases_the_children_and_reports_the_wait() {
    let (mut h, _, a) = grown();
    h.advance(700);
    let t = h.apply(Input::Reshard(&[drained(2, 0, 10), drained(2, 1, 20)]));
    assert!(t.events.contains(&Event::ChildrenReleased {
        version: RoutingVersion(2),
        children: 2,
        waited_ms: 700
    }));
    assert!(h.meta.reshards.is_empty());
    let r = h.send(&follow_up(&a, &[])).unwrap();
    assert_eq!(ids(&r.assigned), vec![0, 1, 2, 3]);
}

#[test]
fn a_drain_observed_against_another_seal_is_ignored() {
    let (mut h, _, _) = grown();
    let t = h.apply(Input::Reshard(&[
        drained(2, 0, 9),
        drained(2, 1, 21),
        drained(3, 0, 10),
    ]));
    assert!(t.next.is_none(), "{t:?}");
    assert_eq!(reshard::parents_not_drained(&h.meta), 2);
}

#[test]
fn an_unsealed_parent_needs_a_seal_and_the_coordinators_seal_is_recorded() {
    let mut h = Harness::new(2);
    h.join("a");
    let r = reshard::grow(&routing(2), 2);
    h.apply(Input::Tick { routing: Some(&r) });
    assert_eq!(reshard::needs(&h.meta).len(), 2);
    assert!(matches!(reshard::needs(&h.meta)[0], Need::Seal { .. }));
    // A drain cannot be recorded before the seal: there is nothing to compare it with.
    h.apply(Input::Reshard(&[drained(2, 0, 10)]));
    assert_eq!(reshard::parents_not_drained(&h.meta), 2);
    let t = h.apply(Input::Reshard(&[Observation::Sealed(seal(2, 0, 10))]));
    assert!(t.events.contains(&Event::ParentSealed {
        version: RoutingVersion(2),
        shard: ShardId(0),
        again: false
    }));
    // A second seal of the same parent does not move the recorded one.
    h.apply(Input::Reshard(&[Observation::Sealed(seal(2, 0, 50))]));
    assert_eq!(h.meta.reshards[0].seals[&ShardId(0)], id(10));
}

#[test]
fn the_tick_copies_seals_the_routing_recorded_later() {
    let mut h = Harness::new(2);
    h.join("a");
    let r = reshard::grow(&routing(2), 2);
    h.apply(Input::Tick { routing: Some(&r) });
    let r = reshard::record_seals(&r, &[seal(2, 1, 20)]).unwrap();
    h.apply(Input::Tick { routing: Some(&r) });
    assert_eq!(h.meta.reshards[0].seals.get(&ShardId(1)), Some(&id(20)));
    assert!(!h.meta.reshards[0].seals.contains_key(&ShardId(0)));
}

#[test]
fn a_lost_fence_reseals_and_undoes_the_drain() {
    let (mut h, _, a) = grown();
    h.apply(Input::Reshard(&[drained(2, 0, 10)]));
    let t = h.apply(Input::Reshard(&[Observation::Resealed(seal(2, 0, 40))]));
    assert!(t.events.contains(&Event::ParentSealed {
        version: RoutingVersion(2),
        shard: ShardId(0),
        again: true
    }));
    assert!(h.meta.reshards[0].drained.is_empty());
    // The old observation no longer counts; only one against the new seal does.
    h.apply(Input::Reshard(&[drained(2, 0, 10), drained(2, 1, 20)]));
    assert_eq!(ids(&h.send(&follow_up(&a, &[])).unwrap().pending), vec![2, 3]);
    h.apply(Input::Reshard(&[drained(2, 0, 40)]));
    assert_eq!(ids(&h.send(&follow_up(&a, &[])).unwrap().assigned), vec![0, 1, 2, 3]);
}

#[test]
fn a_rolled_back_group_holds_its_children_again() {
    let (mut h, r, a) = grown();
    let before = h.meta.clone();
    h.apply(Input::Reshard(&[drained(2, 0, 10), drained(2, 1, 20)]));
    assert!(h.meta.reshards.is_empty());
    // Redis fails over to a replica that never saw the drains: the record is back to "held".
    h.meta = before;
    let t = h.tick();
    assert!(!t.events.iter().any(|e| matches!(e, Event::ChildrenReleased { .. })));
    assert_eq!(ids(&h.send(&follow_up(&a, &[])).unwrap().pending), vec![2, 3]);
    // Older still: before the adoption. The tick adopts again and holds again.
    let mut older = h.meta.clone();
    older.reshards.clear();
    older.shards.truncate(2);
    older.shard_count = 2;
    older.routing_version = RoutingVersion(1);
    h.meta = older;
    h.apply(Input::Tick { routing: Some(&r) });
    assert_eq!(h.meta.reshards.len(), 1);
    assert!(reshard::is_held_child(&h.meta, ShardId(2)));
}

#[test]
fn two_growths_chain_and_the_second_waits_for_the_first() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let r1 = reshard::grow(&routing(2), 2);
    let r2 = reshard::grow(&r1, 4);
    let r2 = reshard::record_seals(
        &r2,
        &(0..2)
            .map(|p| seal(2, p, 1))
            .chain((0..4).map(|p| seal(3, p, 2)))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    // The group adopts both at once (it missed the first).
    h.apply(Input::Tick { routing: Some(&r2) });
    assert_eq!(h.meta.reshards.len(), 2);
    assert_eq!(
        ids(&h.send(&follow_up(&a, &[])).unwrap().pending),
        vec![2, 3, 4, 5, 6, 7]
    );
    // The second growth's parents 0..4 drained (2 and 3 were empty at its seal), the first's not yet.
    h.apply(Input::Reshard(&(0..4).map(|p| drained(3, p, 2)).collect::<Vec<_>>()));
    assert_eq!(
        ids(&h.send(&follow_up(&a, &[])).unwrap().assigned),
        vec![0, 1, 4, 5, 6, 7]
    );
    h.apply(Input::Reshard(&[drained(2, 0, 1), drained(2, 1, 1)]));
    assert_eq!(
        ids(&h.send(&follow_up(&a, &[])).unwrap().assigned),
        (0..8).collect::<Vec<_>>()
    );
}

#[test]
fn a_routing_without_growth_records_holds_the_whole_gap() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    // Recreated after a loss with more shards; versions restart, so any other version is adopted.
    let mut recreated = routing(5);
    recreated.routing_version = RoutingVersion(3);
    h.apply(Input::Tick {
        routing: Some(&recreated),
    });
    let r = &h.meta.reshards[0];
    assert_eq!((r.parents, r.shard_count), (2, 5));
    assert!(r.seals.is_empty());
    assert_eq!(ids(&h.send(&follow_up(&a, &[])).unwrap().pending), vec![2, 3, 4]);
}

#[test]
fn too_many_open_reshards_refuse_the_routing() {
    let mut h = Harness::new(1);
    h.join("a");
    let mut r = routing(1);
    for _ in 0..MAX_RECORDED_GROWTHS {
        r = reshard::grow(&r, 1);
    }
    h.apply(Input::Tick { routing: Some(&r) });
    assert_eq!(h.meta.reshards.len(), MAX_RECORDED_GROWTHS);
    let more = reshard::grow(&r, 1);
    let t = h.apply(Input::Tick { routing: Some(&more) });
    assert!(t.events.contains(&Event::RoutingRefused {
        version: more.routing_version
    }));
    assert_eq!(h.meta.shard_count, r.shard_count, "not adopted without holding");
}

mod property {
    //! Random writes, reads, growths, seals, ticks, observations, lost fences and Redis rollbacks of the group
    //! metadata, against a model of the shards: no child is ever readable before the group consumed every parent
    //! of its growth up to the parent's first seal (the instant its fence was first set).

    use super::*;
    use crate::state_machine::harness::member;
    use crate::state_machine::view;
    use proptest::prelude::*;
    use protocol::metadata::GroupMetadata;
    use std::collections::BTreeMap;

    const MAX_SHARDS: u32 = 12;

    #[derive(Debug, Clone)]
    enum Op {
        Write(u32),
        Consume(u32),
        Grow(u32),
        SealRouting,
        Tick,
        Observe,
        LoseFence(u32),
        Snapshot,
        Rollback,
        Advance(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..MAX_SHARDS).prop_map(Op::Write),
            6 => (0..MAX_SHARDS).prop_map(Op::Consume),
            1 => (1u32..5).prop_map(Op::Grow),
            2 => Just(Op::SealRouting),
            4 => Just(Op::Tick),
            4 => Just(Op::Observe),
            1 => (0..MAX_SHARDS).prop_map(Op::LoseFence),
            1 => Just(Op::Snapshot),
            1 => Just(Op::Rollback),
            2 => (1u16..2000).prop_map(Op::Advance),
        ]
    }

    struct Model {
        h: Harness,
        routing: StreamRouting,
        /// Every growth ever made (the routing keeps only the last ones).
        growths: Vec<(RoutingVersion, u32, u32)>,
        /// Last entry id (ms part) per shard; the group's consumed position per shard.
        written: Vec<u64>,
        consumed: Vec<u64>,
        /// Per shard: the fence, lost or not.
        fence: Vec<u64>,
        /// The position when the fence of (growth, parent) was first set.
        first_seal: BTreeMap<(RoutingVersion, u32), u64>,
        snapshot: Option<GroupMetadata>,
        /// The member's last answer (it heartbeats after every clock step, so it never expires).
        last: protocol::messages::HeartbeatResponse,
    }

    impl Model {
        fn readable(&self, s: u32) -> bool {
            view(&self.h.meta, &member("a"), self.h.now)
                .assigned
                .contains(&ShardId(s))
        }

        fn keep_alive(&mut self) {
            self.last = match self.h.send(&follow_up(&self.last, &[])) {
                Ok(r) => r,
                Err(_) => self.h.join("a"),
            };
        }

        fn seal(&mut self, v: RoutingVersion, p: u32) -> Seal {
            self.fence[p as usize] = self.fence[p as usize].max(v.0);
            let pos = self.written[p as usize];
            self.first_seal.entry((v, p)).or_insert(pos);
            seal(v.0, p, pos)
        }

        fn step(&mut self, op: &Op) {
            match *op {
                Op::Write(s) if s < self.routing.shard_count => self.written[s as usize] += 1,
                // The consumer reads only what the group's answer lets it read.
                Op::Consume(s) if self.readable(s) => self.consumed[s as usize] = self.written[s as usize],
                Op::Grow(k) if self.routing.shard_count + k <= MAX_SHARDS => {
                    self.routing = reshard::grow(&self.routing, k);
                    let g = self.routing.growths.last().unwrap();
                    self.growths.push((g.routing_version, g.parents, g.shard_count));
                }
                Op::SealRouting => {
                    let seals: Vec<Seal> = reshard::unsealed(&self.routing)
                        .into_iter()
                        .map(|(v, p)| self.seal(v, p.0))
                        .collect();
                    if let Some(r) = reshard::record_seals(&self.routing, &seals) {
                        self.routing = r;
                    }
                }
                Op::Tick => {
                    self.h.apply(Input::Tick {
                        routing: Some(&self.routing),
                    });
                }
                Op::Observe => {
                    let mut observed = Vec::new();
                    for need in reshard::needs(&self.h.meta) {
                        match need {
                            Need::Seal {
                                routing_version, shard, ..
                            } => observed.push(Observation::Sealed(self.seal(routing_version, shard.0))),
                            Need::Drain {
                                routing_version,
                                shard,
                                seal: at,
                                ..
                            } => {
                                if self.fence[shard.index()] < routing_version.0 {
                                    observed.push(Observation::Resealed(self.seal(routing_version, shard.0)));
                                } else if self.consumed[shard.index()] >= at.ms {
                                    observed.push(drained(routing_version.0, shard.0, at.ms));
                                }
                            }
                        }
                    }
                    self.h.apply(Input::Reshard(&observed));
                }
                Op::LoseFence(s) => self.fence[s as usize] = 0,
                Op::Snapshot => self.snapshot = Some(self.h.meta.clone()),
                Op::Rollback => {
                    if let Some(m) = self.snapshot.take() {
                        self.h.meta = m;
                    }
                }
                Op::Advance(ms) => {
                    self.h.advance(u64::from(ms));
                    self.keep_alive();
                }
                _ => {}
            }
        }

        fn check(&self, ops: &[Op]) {
            let readable = view(&self.h.meta, &member("a"), self.h.now).assigned;
            for s in readable {
                for &(v, parents, count) in &self.growths {
                    if s.0 < parents || s.0 >= count {
                        continue;
                    }
                    for p in 0..parents {
                        let sealed_at = self.first_seal.get(&(v, p));
                        assert!(
                            sealed_at.is_some_and(|&at| self.consumed[p as usize] >= at),
                            "child {s} of growth {v} readable before parent {p} was consumed to its seal \
                             ({sealed_at:?}, consumed {}); ops {ops:#?}",
                            self.consumed[p as usize]
                        );
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn no_child_is_read_before_its_parents_drained(ops in prop::collection::vec(op(), 1..120)) {
            let mut h = Harness::new(2);
            let last = h.join("a");
            let mut m = Model {
                last,
                h,
                routing: routing(2),
                growths: Vec::new(),
                written: vec![0; MAX_SHARDS as usize],
                consumed: vec![0; MAX_SHARDS as usize],
                fence: vec![0; MAX_SHARDS as usize],
                first_seal: BTreeMap::new(),
                snapshot: None,
            };
            let mut done = Vec::new();
            for op in &ops {
                done.push(op.clone());
                m.step(op);
                m.check(&done);
            }
            // A live member heartbeats on. A rollback can leave the restored record waiting on acknowledgements it
            // lost: the member is fenced for them, joins again on its next heartbeat, and what it owned stays held
            // until the old incarnation's lease has run out. Heartbeat through that before asking for liveness.
            let t = m.h.meta.timings;
            let interval = u16::try_from(t.heartbeat_interval_ms).expect("the harness's interval fits");
            for _ in 0..=(t.member_ttl_ms + t.assignment_lease_ms) / t.heartbeat_interval_ms {
                m.step(&Op::Advance(interval));
                m.check(&done);
            }
            // Liveness: with every parent consumed and observed, every child becomes readable (one level of a chain
            // of growths per round at least).
            for _ in 0..MAX_SHARDS + 2 {
                m.step(&Op::SealRouting);
                m.step(&Op::Tick);
                for s in 0..m.routing.shard_count {
                    m.step(&Op::Consume(s));
                }
                m.step(&Op::Observe);
                m.check(&done);
            }
            let readable = view(&m.h.meta, &member("a"), m.h.now).assigned.len() as u32;
            prop_assert_eq!(readable, m.routing.shard_count, "meta {:#?}", m.h.meta);
        }
    }
}
