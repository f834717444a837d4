//! Growing a stream without breaking per-key order: sealed parents, held children (see `docs/resharding.md`).
//!
//! With jump hash a growth moves keys only from old shards (the *parents*, all of them) to new ones (the
//! *children*). Two records, both in Redis:
//! * the stream routing's [`Growth`]: each parent's seal position, recorded once the seal script set the parent's
//!   fence (from then on only producers routing with the growth can write into it);
//! * a group's [`GroupReshard`] per adopted growth: the seals it knows and the parents the coordinator observed it
//!   to have drained (delivered and acknowledged every entry up to the seal).
//!
//! A child is *held* (targeted and owned as usual, answered as pending, never readable) while any open reshard of
//! its group lists it as a child; a reshard closes when every parent is drained. The rules only ever add
//! knowledge that Redis confirmed, so a lost record (a Redis rollback) makes the coordinator seal or observe
//! again, and never releases a child early: a seal taken later covers more entries, and a drain is recorded only
//! from an observation against the seal the record holds.

use protocol::metadata::{GroupMetadata, StreamRouting};
use protocol::reshard::{EntryId, GroupReshard, Growth, MAX_RECORDED_GROWTHS};
use protocol::{RoutingVersion, ShardId};
use std::collections::BTreeSet;

use super::transition::{Answer, Clock, Event, Liveness, Transition, Tx};

/// The routing after adding `count` shards: the next version, with a growth record whose parents are all still
/// to be sealed. Only the last [`MAX_RECORDED_GROWTHS`] growths are kept.
pub fn grow(routing: &StreamRouting, count: u32) -> StreamRouting {
    let mut next = StreamRouting {
        shard_count: routing.shard_count.saturating_add(count),
        routing_version: routing.routing_version.next(),
        ..routing.clone()
    };
    next.growths.push(Growth {
        routing_version: next.routing_version,
        parents: routing.shard_count,
        shard_count: next.shard_count,
        seals: Default::default(),
    });
    let excess = next.growths.len().saturating_sub(MAX_RECORDED_GROWTHS);
    next.growths.drain(..excess);
    next
}

/// One seal script's answer: the parent's position when its fence was set to the growth's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// The growth.
    pub routing_version: RoutingVersion,
    /// The parent.
    pub shard: ShardId,
    /// The last entry id of the parent when the fence was set.
    pub position: EntryId,
}

/// The parents of the routing's growths still to be sealed, oldest growth first.
pub fn unsealed(routing: &StreamRouting) -> Vec<(RoutingVersion, ShardId)> {
    routing
        .growths
        .iter()
        .flat_map(|g| g.unsealed().map(move |p| (g.routing_version, p)))
        .collect()
}

/// The routing with `seals` recorded; `None` when none of them is new. A seal for a growth the routing no
/// longer records, or for a parent sealed already, is ignored: the first recorded seal stays, so every group
/// that copied it keeps a seal the routing agrees with.
pub fn record_seals(routing: &StreamRouting, seals: &[Seal]) -> Option<StreamRouting> {
    let mut next = routing.clone();
    let mut changed = false;
    for s in seals {
        let Some(g) = next.growths.iter_mut().find(|g| g.routing_version == s.routing_version) else {
            continue;
        };
        if s.shard.0 < g.parents && !g.seals.contains_key(&s.shard) {
            g.seals.insert(s.shard, s.position);
            changed = true;
        }
    }
    changed.then_some(next)
}

/// What the coordinator saw in Redis for one parent of one of the group's open reshards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// The coordinator sealed the parent itself (the group knew no seal for it, and the routing had none).
    Sealed(Seal),
    /// The parent's fence was found below the growth's version (lost in a Redis rollback) and set again: the
    /// seal moves to `position` and the parent must be drained again up to it.
    Resealed(Seal),
    /// The group has delivered every entry of the parent up to `seal` and none of them is still pending.
    Drained {
        /// The growth.
        routing_version: RoutingVersion,
        /// The parent.
        shard: ShardId,
        /// The seal the observation was made against.
        seal: EntryId,
    },
}

/// What the coordinator must look at in Redis for the group's open reshards, per parent not yet drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// No seal known: run the seal script (with the growth's version).
    Seal {
        /// The growth.
        routing_version: RoutingVersion,
        /// The parent.
        shard: ShardId,
        /// The shard count of the growth's layout (the seal writes it beside the fence).
        shard_count: u32,
    },
    /// Check whether the group drained the parent up to `seal` (and that the fence still holds).
    Drain {
        /// The growth.
        routing_version: RoutingVersion,
        /// The parent.
        shard: ShardId,
        /// The seal recorded in the group.
        seal: EntryId,
        /// The shard count of the growth's layout (a seal taken again writes it beside the fence).
        shard_count: u32,
    },
}

/// The observations the group's open reshards wait for.
pub fn needs(meta: &GroupMetadata) -> Vec<Need> {
    let mut out = Vec::new();
    for r in &meta.reshards {
        for p in (0..r.parents).map(ShardId).filter(|p| !r.drained.contains(p)) {
            out.push(match r.seals.get(&p) {
                Some(&seal) => Need::Drain {
                    routing_version: r.routing_version,
                    shard: p,
                    seal,
                    shard_count: r.shard_count,
                },
                None => Need::Seal {
                    routing_version: r.routing_version,
                    shard: p,
                    shard_count: r.shard_count,
                },
            });
        }
    }
    out
}

/// Whether `shard` is held for the group: a child of a growth whose parents it has not all drained.
pub fn is_held_child(meta: &GroupMetadata, shard: ShardId) -> bool {
    meta.reshards.iter().any(|r| r.is_child(shard))
}

/// Parents of open reshards not yet drained, counted once per reshard (the gauge).
pub fn parents_not_drained(meta: &GroupMetadata) -> usize {
    meta.reshards.iter().map(|r| r.parents as usize - r.drained.len()).sum()
}

/// At routing adoption (in the tick): opens a reshard for each growth between the group's shard count and the
/// routing's. When the routing does not record the growths that lead there (they were dropped, or the routing
/// was lost and recreated), one reshard over the whole gap is opened with no seal known: the coordinator seals
/// the parents itself, later than the growth, which only makes the children wait longer. Returns `false`, and
/// changes nothing, when the group would have more than [`MAX_RECORDED_GROWTHS`] open reshards: the routing is
/// then refused (adopted once older reshards closed), never adopted without holding its children.
pub(super) fn adopt(tx: &mut Tx<'_>, routing: &StreamRouting, from_shards: u32, now_ms: u64) -> bool {
    let mut at = from_shards;
    let mut opened = Vec::new();
    for g in &routing.growths {
        if g.parents == at && g.shard_count > at && g.shard_count <= routing.shard_count {
            opened.push(GroupReshard {
                routing_version: g.routing_version,
                parents: g.parents,
                shard_count: g.shard_count,
                seals: g.seals.clone(),
                drained: BTreeSet::new(),
                since_ms: now_ms,
            });
            at = g.shard_count;
        }
    }
    if at != routing.shard_count {
        // The growths do not chain from the group's count to the routing's: cover the whole gap at once.
        opened = vec![GroupReshard {
            routing_version: routing.routing_version,
            parents: from_shards,
            shard_count: routing.shard_count,
            seals: Default::default(),
            drained: BTreeSet::new(),
            since_ms: now_ms,
        }];
    }
    // A reshard recorded already (a routing rolled back and adopted again) keeps its knowledge.
    opened.retain(|r| !tx.get().reshards.iter().any(|o| o.routing_version == r.routing_version));
    if tx.get().reshards.len() + opened.len() > MAX_RECORDED_GROWTHS {
        return false;
    }
    for r in opened {
        tx.events.push(Event::ReshardOpened {
            version: r.routing_version,
            parents: r.parents,
            shard_count: r.shard_count,
        });
        let list = &mut tx.get_mut().reshards;
        let at = list.partition_point(|o| o.routing_version < r.routing_version);
        list.insert(at, r);
    }
    true
}

/// Copies seals the routing records into open reshards that know none for the parent (every tick).
pub(super) fn copy_seals(tx: &mut Tx<'_>, routing: &StreamRouting) {
    let mut copies = Vec::new();
    for (i, r) in tx.get().reshards.iter().enumerate() {
        let Some(g) = routing.growths.iter().find(|g| g.routing_version == r.routing_version) else {
            continue;
        };
        if g.parents != r.parents || g.shard_count != r.shard_count {
            continue;
        }
        for (p, &pos) in &g.seals {
            if !r.seals.contains_key(p) {
                copies.push((i, *p, pos));
            }
        }
    }
    for (i, p, pos) in copies {
        tx.get_mut().reshards[i].seals.insert(p, pos);
    }
}

/// Records observations; an observation that does not match the record (another seal, an unknown reshard or
/// parent) changes nothing.
pub(super) fn record(tx: &mut Tx<'_>, observed: &[Observation]) {
    for o in observed {
        let (version, shard) = match *o {
            Observation::Sealed(s) | Observation::Resealed(s) => (s.routing_version, s.shard),
            Observation::Drained {
                routing_version, shard, ..
            } => (routing_version, shard),
        };
        let Some(i) = tx.get().reshards.iter().position(|r| r.routing_version == version) else {
            continue;
        };
        let r = &tx.get().reshards[i];
        if shard.0 >= r.parents {
            continue;
        }
        match *o {
            Observation::Sealed(s) if !r.seals.contains_key(&shard) => {
                tx.get_mut().reshards[i].seals.insert(shard, s.position);
                tx.events.push(Event::ParentSealed {
                    version,
                    shard,
                    again: false,
                });
            }
            Observation::Resealed(s) if r.seals.get(&shard) != Some(&s.position) || r.drained.contains(&shard) => {
                let r = &mut tx.get_mut().reshards[i];
                r.seals.insert(shard, s.position);
                r.drained.remove(&shard);
                tx.events.push(Event::ParentSealed {
                    version,
                    shard,
                    again: true,
                });
            }
            Observation::Drained { seal, .. } if r.seals.get(&shard) == Some(&seal) && !r.drained.contains(&shard) => {
                tx.get_mut().reshards[i].drained.insert(shard);
                tx.events.push(Event::ParentDrained { version, shard });
            }
            _ => {}
        }
    }
}

/// Closes every reshard whose parents are all drained: its children become readable.
pub(super) fn release(tx: &mut Tx<'_>, now_ms: u64) {
    let done: Vec<(RoutingVersion, u32, u64)> = tx
        .get()
        .reshards
        .iter()
        .filter(|r| r.done())
        .map(|r| (r.routing_version, r.shard_count - r.parents, r.since_ms))
        .collect();
    if done.is_empty() {
        return;
    }
    tx.get_mut().reshards.retain(|r| !r.done());
    for (version, children, since) in done {
        tx.events.push(Event::ChildrenReleased {
            version,
            children,
            waited_ms: now_ms.saturating_sub(since),
        });
    }
}

/// The input [`super::Input::Reshard`]: records what the coordinator observed, then releases what is done.
pub(super) fn observe(meta: &GroupMetadata, liveness: &Liveness, observed: &[Observation], clock: Clock) -> Transition {
    let mut tx = Tx::new(meta, liveness);
    tx.open_round_if_suspected(clock);
    record(&mut tx, observed);
    release(&mut tx, clock.now_ms);
    tx.finish(None, Answer::Done, clock.now_ms)
}
