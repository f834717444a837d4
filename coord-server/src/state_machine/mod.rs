//! The coordinator's core: a pure state machine over a group's recorded metadata.
//!
//! ```text
//! apply(metadata, liveness, input, clock) -> Transition { next metadata?, liveness writes, outcome, events }
//! ```
//!
//! No I/O, no clock, no randomness: the caller loads the metadata under the group's Redis mutex, passes Redis
//! `TIME` as the clock, writes `next` (and the liveness renewals) with the revision compare-and-set, and only then
//! sends the outcome. The same inputs always give the same transition, so a lost response is repaired by the
//! client's retry, and a model checker or property test can drive it as it is.
//!
//! # Layout
//! * `transition`: what every rule below works on: the clock, the liveness, the draft ([`Tx`]), the events and
//!   the outcome. The root dispatches the inputs ([`apply`]) and ends a transition (`Tx::finish`).
//! * [`assignor`]: uniform sticky target assignment.
//! * `target`: records new targets and assignment epochs.
//! * `reconcile`: one member's view (assigned / pending / revoke) and ownership moves.
//! * [`incarnation`]: which join of which process a request speaks for; minting incarnations.
//! * `lease`: lease ends, expiry, holds for a predecessor incarnation, rebalance timeout.
//! * `correction`: the metadata correction round; [`bounds`]: how far a reported version may move the stored one.
//! * `fencing`: fencing tokens, minted per shard for every new owner.
//! * [`reshard`]: growths: parents' seals, children held until the group drained their parents.
//! * [`due`]: when a group next needs a tick (the due index's score).
//! * `heartbeat`, `tick`: the inputs (the tick module also holds admin fencing).
//! * [`quota`]: the member quota, checked before a join is applied.
//! * [`grace`]: the expiry grace and suspected loss of a load; [`recreate`]: what recreating a lost group
//!   writes; [`routing`]: a producer's routing answer (`SYNC_METADATA`).
//! * Tests only: `harness` (the core driven as the coordinator drives it), `model` (the exhaustive model check,
//!   see `docs/model-check.md`), `proptests`, and the `*tests` files.

pub mod assignor;
pub mod bounds;
mod correction;
pub mod due;
mod fencing;
pub mod grace;
mod heartbeat;
pub mod incarnation;
mod lease;
pub mod quota;
mod reconcile;
pub mod recreate;
pub mod reshard;
pub mod routing;
mod target;
mod tick;
mod transition;

#[cfg(test)]
mod fencing_tests;
#[cfg(test)]
pub(crate) mod harness;
#[cfg(test)]
mod late_request_tests;
#[cfg(test)]
pub(crate) mod model;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod quota_tests;
#[cfg(test)]
mod reshard_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod version_bound_tests;

use protocol::messages::{
    CorrectionDescription, GroupDescription, HeartbeatRequest, HeartbeatResponse, MemberDescription, ShardDescription,
    ShardToken,
};
use protocol::metadata::{GroupMetadata, GroupTimings, StreamRouting};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{Incarnation, MemberEpoch, ShardId, Status, StoreRevision};
use std::borrow::Cow;
use std::collections::BTreeMap;

pub use reconcile::{view, MemberView};
use transition::Answer;
pub use transition::{Clock, Event, Liveness, Outcome, Rejection, Transition, Tx};

/// What happened to the group.
#[derive(Debug)]
pub enum Input<'a> {
    /// A consumer heartbeat (join with epoch 0, leave with epoch -1).
    Heartbeat(&'a HeartbeatRequest),
    /// Periodic work: expiry, rebalance-timeout fencing, hold ends, routing adoption, closing a correction round.
    Tick {
        /// The stream's routing, when the caller loaded it (adopted if newer).
        routing: Option<&'a StreamRouting>,
    },
    /// Admin: fence a member now. It gets FENCED_MEMBER_EPOCH from now on; its shards move when its lease ends.
    FenceMember(&'a MemberId),
    /// What the coordinator observed in Redis for the group's open reshards (seals taken, parents drained).
    Reshard(&'a [reshard::Observation]),
}

impl Tx<'_> {
    /// Opens a correction round when the caller suspects lost writes (see [`Clock::suspected_loss`]).
    fn open_round_if_suspected(&mut self, clock: Clock) {
        if let Some(known) = clock.suspected_loss {
            let stored = self.get().metadata_version;
            self.events.push(Event::LossSuspected { known, stored });
            // A new loss: what clients saw of it is evidence again (see `reportsSettled`).
            if self.get().reports_settled {
                self.get_mut().reports_settled = false;
            }
            correction::open(self, known.max(stored), clock.now_ms, true);
        }
    }

    /// Removes a member from the group: releases its shards, forgets its liveness and round bookkeeping.
    fn remove_member(&mut self, id: &MemberId) {
        reconcile::release_all(self, id);
        correction::forget(self, id);
        self.get_mut().members.remove(id);
        self.forget.push(id.clone());
    }

    /// Ends the transition: bumps the metadata version if anything changed, then derives the answer from the
    /// metadata that will be written (never from the draft before the bump).
    fn finish(self, renew: Option<(MemberId, u64)>, answer: Answer, now_ms: u64) -> Transition {
        let renew: Vec<(MemberId, u64)> = renew.into_iter().collect();
        let Tx {
            meta, events, forget, ..
        } = self;
        let (next, outcome) = match meta {
            Cow::Borrowed(recorded) => (None, answer.outcome(recorded, now_ms)),
            Cow::Owned(mut next) => {
                // Held still while a round is open: see `correction`.
                if next.correction.is_none() {
                    next.metadata_version = bounds::bump(next.metadata_version);
                }
                let outcome = answer.outcome(&next, now_ms);
                (Some(next), outcome)
            }
        };
        Transition {
            next,
            renew,
            forget,
            outcome,
            events,
        }
    }
}

impl Answer {
    fn outcome(self, recorded: &GroupMetadata, now_ms: u64) -> Outcome {
        match self {
            Answer::Member { id, status } => Outcome::Heartbeat(response(recorded, &id, status, now_ms)),
            Answer::Left { id, incarnation } => {
                let mut r = response(recorded, &id, Status::Ok, now_ms);
                r.member_epoch = MemberEpoch::LEAVE;
                r.incarnation = incarnation;
                Outcome::Heartbeat(r)
            }
            Answer::Rejected(r) => Outcome::Rejected(r),
            Answer::Done => Outcome::Done,
        }
    }
}

/// Applies one input to a group's metadata. Pure: see the module docs for the caller's duties.
pub fn apply(meta: &GroupMetadata, liveness: &Liveness, input: Input<'_>, clock: Clock) -> Transition {
    match input {
        Input::Heartbeat(req) => heartbeat::heartbeat(meta, liveness, req, clock),
        Input::Tick { routing } => tick::tick(meta, liveness, routing, clock),
        Input::FenceMember(id) => tick::fence_by_admin(meta, liveness, id, clock),
        Input::Reshard(observed) => reshard::observe(meta, liveness, observed, clock),
    }
}

/// Applies several heartbeats of one group in order, as one transition (group commit): each request sees the
/// state the previous ones left, each answer is derived from the state right after its own request, and the
/// caller writes the final state once. The result is exactly what applying them one by one and writing after each
/// would record, so batching changes the cost, not the behaviour.
pub fn apply_heartbeats(
    meta: &GroupMetadata,
    liveness: &Liveness,
    reqs: &[&HeartbeatRequest],
    clock: Clock,
) -> (Transition, Vec<Outcome>) {
    let unlimited: Vec<Admission<'_>> = reqs.iter().map(|&req| Admission { req, max_members: None }).collect();
    apply_heartbeats_within(meta, liveness, &unlimited, clock)
}

/// A heartbeat with the member quota of the token that sent it.
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The request.
    pub req: &'a HeartbeatRequest,
    /// The most members its group may hold after a join (`None`: no limit).
    pub max_members: Option<u32>,
}

/// [`apply_heartbeats`], refusing each join that would take its group past the member quota of its request
/// ([`quota::refuse_join`]) with `QUOTA_EXCEEDED`, before it is applied: a refused join changes nothing. Each
/// request is checked against the state the previous ones left, so one batch never overshoots the quota.
pub fn apply_heartbeats_within(
    meta: &GroupMetadata,
    liveness: &Liveness,
    reqs: &[Admission<'_>],
    clock: Clock,
) -> (Transition, Vec<Outcome>) {
    let mut current: Cow<'_, GroupMetadata> = Cow::Borrowed(meta);
    let mut live: Cow<'_, Liveness> = Cow::Borrowed(liveness);
    let mut renew: BTreeMap<MemberId, u64> = BTreeMap::new();
    let mut forget: Vec<MemberId> = Vec::new();
    let mut events = Vec::new();
    let mut outcomes = Vec::with_capacity(reqs.len());
    let mut clock = clock;
    for &Admission { req, max_members } in reqs {
        if let Some(refusal) = max_members.and_then(|max| quota::refuse_join(&current, req, max)) {
            outcomes.push(Outcome::Rejected(refusal));
            continue;
        }
        let t = apply(&current, &live, Input::Heartbeat(req), clock);
        if let Some(next) = t.next {
            current = Cow::Owned(next);
            // The suspicion is recorded (as an open round) by this write; later requests need not repeat it.
            clock.suspected_loss = None;
        }
        for (member, lease) in t.renew {
            let entry = live.to_mut().entry(member.clone()).or_insert(0);
            *entry = (*entry).max(lease);
            let r = renew.entry(member).or_insert(0);
            *r = (*r).max(lease);
        }
        for member in t.forget {
            live.to_mut().remove(&member);
            renew.remove(&member);
            forget.push(member);
        }
        events.extend(t.events);
        outcomes.push(t.outcome);
    }
    let next = match current {
        Cow::Borrowed(_) => None,
        Cow::Owned(next) => Some(next),
    };
    let transition = Transition {
        next,
        renew: renew.into_iter().collect(),
        forget,
        outcome: Outcome::Done,
        events,
    };
    (transition, outcomes)
}

/// A new group's metadata.
pub fn create_group(
    stream: StreamName,
    group: GroupName,
    routing: &StreamRouting,
    timings: GroupTimings,
    now_ms: u64,
) -> GroupMetadata {
    GroupMetadata::new(
        stream,
        group,
        routing.shard_count,
        routing.routing_version,
        timings,
        now_ms,
    )
}

/// The routing after adding `count` shards, with a growth record whose parents are still to be sealed.
pub fn add_shards(routing: &StreamRouting, count: u32) -> StreamRouting {
    reshard::grow(routing, count)
}

/// The admin view of a group.
pub fn describe(meta: &GroupMetadata, liveness: &Liveness, revision: StoreRevision, now_ms: u64) -> GroupDescription {
    let members = meta
        .members
        .iter()
        .map(|(id, m)| {
            let v = view(meta, id, now_ms);
            MemberDescription {
                member_id: id.clone(),
                epoch: m.epoch,
                instance_id: m.instance_id.clone(),
                incarnation: m.incarnation,
                lease_until_ms: lease::lease_end(id, m, liveness),
                fenced: m.fenced_at_ms.is_some(),
                assigned: v.assigned,
                pending: v.pending,
                revoke: v.revoke,
            }
        })
        .collect();
    let shards = meta
        .shards
        .iter()
        .enumerate()
        .map(|(i, s)| ShardDescription {
            shard: ShardId(i as u32),
            target: s.target.clone(),
            owner: s.owner.clone(),
            fencing_token: s.fencing_token,
        })
        .collect();
    let correction = meta.correction.as_ref().map(|r| CorrectionDescription {
        started_at_ms: r.started_at_ms,
        reported_max_version: r.reported_max_version,
        synced: r.synced.iter().cloned().collect(),
        unsynced: meta
            .members
            .iter()
            .filter(|(id, m)| m.fenced_at_ms.is_none() && !r.synced.contains(*id))
            .map(|(id, _)| id.clone())
            .collect(),
    });
    GroupDescription {
        stream: meta.stream.clone(),
        group: meta.group.clone(),
        revision,
        metadata_version: meta.metadata_version,
        assignment_epoch: meta.assignment_epoch,
        routing_version: meta.routing_version,
        shard_count: meta.shard_count,
        timings: meta.timings,
        members,
        shards,
        correction,
    }
}

fn response(meta: &GroupMetadata, id: &MemberId, status: Status, now_ms: u64) -> HeartbeatResponse {
    let v = view(meta, id, now_ms);
    let fencing_tokens = v
        .assigned
        .iter()
        .filter_map(|&shard| {
            let token = meta.shards.get(shard.index())?.fencing_token;
            Some(ShardToken { shard, token })
        })
        .collect();
    HeartbeatResponse {
        status,
        member_id: id.clone(),
        incarnation: meta.members.get(id).map_or(Incarnation::NONE, |m| m.incarnation),
        member_epoch: meta.members.get(id).map_or(MemberEpoch::LEAVE, |m| m.epoch),
        metadata_version: meta.metadata_version,
        assignment_epoch: meta.assignment_epoch,
        assigned: v.assigned,
        fencing_tokens,
        pending: v.pending,
        revoke: v.revoke,
        heartbeat_interval_ms: meta.timings.heartbeat_interval_ms,
        assignment_lease_ms: meta.timings.assignment_lease_ms,
        shard_count: meta.shard_count,
        routing_version: meta.routing_version,
    }
}
