//! The heartbeat path: join (epoch 0), heartbeat, leave (epoch -1).
//!
//! Order of the checks, each explained where it is made:
//! 1. reject malformed input before anything else;
//! 2. a reported version above the stored one, within what a lost history can produce (`bounds`), opens (or
//!    feeds) the correction round, whatever follows, unless a round already settled this history's reports
//!    (`reportsSettled`: then it is a version no coordinator issued);
//! 3. identify the incarnation (`incarnation`): a new join, a retried join, or the recorded incarnation; a
//!    request naming any other changes nothing; then the epoch: current, or previous after a lost response;
//! 4. apply REVOKED acks that match the recorded ownership (others change nothing);
//! 5. advance the member's epoch once it has nothing left to drain;
//! 6. inside a round: SYNC_METADATA until the member carries the stored version, then REVOKE_PENDING until the
//!    round closes; outside: OK;
//! 7. renew the member's lease (liveness hash) unless it is fenced.

use protocol::messages::{is_valid_instance_id, HeartbeatRequest, RevokeState, MAX_INSTANCE_ID_LEN};
use protocol::metadata::{MemberRecord, MAX_SHARDS};
use protocol::names::MemberId;
use protocol::{MemberEpoch, MetadataVersion, ShardId, Status};
use std::collections::BTreeSet;

use super::incarnation::{self, Identity, Stale};
use super::lease::{is_held, lease_end};
use super::reconcile::{accept_revoked, has_revokes, settle, view};
use super::transition::{Answer, Clock, Event, Liveness, Transition, Tx};
use super::{bounds, correction, fencing, target};

pub(super) fn heartbeat(
    meta: &protocol::metadata::GroupMetadata,
    liveness: &Liveness,
    req: &HeartbeatRequest,
    clock: Clock,
) -> Transition {
    let now = clock.now_ms;
    let mut tx = Tx::new(meta, liveness);
    if let Err(message) = validate(req) {
        return tx.finish(None, Answer::reject(Status::InvalidRequest, message, None), now);
    }
    // An incarnation no coordinator of this group can have minted names nothing: the request is taken as naming
    // none (a join is then a new process's, anything else is not recorded). Not a 400: the number is well formed.
    let ceiling = incarnation::ceiling(meta, now);
    let sanitized;
    let req = if req.incarnation > ceiling {
        tx.events.push(Event::ImplausibleIncarnationIgnored {
            named: req.incarnation,
            ceiling,
        });
        sanitized = HeartbeatRequest {
            incarnation: protocol::Incarnation::NONE,
            ..req.clone()
        };
        &sanitized
    } else {
        req
    };
    tx.open_round_if_suspected(clock);
    let stored = meta.metadata_version;
    let reported = req.max_observed_version.max(req.metadata_version);
    if reported > stored {
        let ceiling = bounds::report_ceiling(stored, now);
        if reported > ceiling {
            // No lost history reaches it: a buggy or hostile client. Served as if it carried the stored version.
            tx.events.push(Event::ImplausibleVersionIgnored { reported, ceiling });
        } else if !correction::is_open(&tx) && tx.get().reports_settled {
            // A closed round retired every version this Redis history issued, and no new loss was seen since:
            // no coordinator issued this one. Opening a round for it would let one damaged version store (or a
            // hostile client reporting ever higher versions) hold the group in rounds.
            tx.events.push(Event::UnissuedVersionIgnored { reported, stored });
        } else {
            // Whoever sends it, even a leave or a member Redis does not know: a loss is what makes Redis forget
            // members, and others may hold leases from the lost history.
            tx.events.push(Event::RegressionReported { reported, stored });
            correction::open(&mut tx, reported, now, false);
        }
    }
    if req.member_epoch.is_leave() {
        return leave(tx, req, now);
    }

    let id = &req.member_id;
    let joining = match incarnation::identify(meta, req) {
        Identity::NewJoin => true,
        // The same join again (its answer was lost): answer the recorded state.
        Identity::RetriedJoin => false,
        Identity::NotRecorded(why) => {
            let msg = not_recorded(req, why);
            return tx.finish(None, Answer::reject(refusal(meta, req), msg, None), now);
        }
        Identity::Current(member) => {
            if member.fenced_at_ms.is_some() {
                let msg = format!("member {id} was fenced; stop reading and rejoin with epoch 0");
                return tx.finish(
                    None,
                    Answer::reject(Status::FencedMemberEpoch, msg, Some(member.epoch)),
                    now,
                );
            }
            if !epoch_accepted(&tx, member, req, now) {
                let msg = format!(
                    "member epoch {} of {id} is stale; the group records {}",
                    req.member_epoch, member.epoch
                );
                return tx.finish(
                    None,
                    Answer::reject(Status::FencedMemberEpoch, msg, Some(member.epoch)),
                    now,
                );
            }
            false
        }
    };
    if joining {
        join(&mut tx, req, now);
    }

    for r in req.revoking.iter().filter(|r| r.state == RevokeState::Revoked) {
        if correction::is_open(&tx) {
            correction::clear_claim(&mut tx, id, r.shard);
        }
        if !accept_revoked(&mut tx, id, r.shard, req.metadata_version, now)
            && tx
                .get()
                .shards
                .get(r.shard.index())
                .is_some_and(|s| s.owner.as_ref() == Some(id))
        {
            // Owned and targeted (or held): the ack does not match the recorded ownership.
            tx.events.push(Event::StaleAckIgnored {
                shard: r.shard,
                member: id.clone(),
            });
        }
    }

    if correction::is_open(&tx) && req.metadata_version == stored {
        // At the stored version the report lists everything the member reads or drains: a claim it no longer
        // lists has ended (a late duplicate may have recorded it after the member had acknowledged the shard).
        correction::keep_listed_claims(&mut tx, id, &listed_shards(req));
    }
    // A request behind the stored version was sent before writes Redis has, its own acks among them (a late or
    // duplicated request): its claims are explained by that history and are no evidence of a loss.
    let claims = if req.metadata_version < stored {
        Vec::new()
    } else {
        foreign_claims(&tx, req)
    };
    if !claims.is_empty() {
        // A member reading a shard Redis records for someone else: a lost write whose version number was reused.
        correction::open(&mut tx, stored, now, false);
        correction::record_claims(&mut tx, id, &claims);
    }

    settle(&mut tx, now);
    advance_epoch(&mut tx, id, now);

    let status = if correction::is_open(&tx) {
        if joining || req.metadata_version == tx.get().metadata_version {
            correction::mark_synced(&mut tx, id);
            if correction::try_close(&mut tx, now) {
                Status::Ok
            } else {
                Status::RevokePending
            }
        } else {
            Status::SyncMetadata
        }
    } else {
        Status::Ok
    };

    let renew = Some((id.clone(), now.saturating_add(tx.get().timings.member_ttl_ms)));
    tx.finish(renew, Answer::Member { id: id.clone(), status }, now)
}

fn validate(req: &HeartbeatRequest) -> Result<(), String> {
    if !is_valid_instance_id(&req.instance_id) {
        return Err(format!(
            "instanceId must be 1 to {MAX_INSTANCE_ID_LEN} visible ASCII characters"
        ));
    }
    if req.member_epoch.0 < -1 {
        return Err(format!(
            "memberEpoch {} is invalid (-1 leaves, 0 joins)",
            req.member_epoch
        ));
    }
    // Larger numbers are not exact in JSON numbers of other languages; the coordinator never stores one.
    let limit = MetadataVersion::MAX_SAFE;
    if req.metadata_version > limit || req.max_observed_version > limit {
        return Err(format!(
            "metadataVersion and maxObservedVersion must be at most {limit} (2^53 - 1)"
        ));
    }
    if req.incarnation.0 > limit.0 || req.max_routing_version.0 > limit.0 {
        return Err(format!(
            "incarnation and maxRoutingVersion must be at most {limit} (2^53 - 1)"
        ));
    }
    if req.max_shard_count > MAX_SHARDS {
        return Err(format!("maxShardCount must be at most {MAX_SHARDS}"));
    }
    let too_many = (MAX_SHARDS as usize) * 2;
    if req.owned.len() + req.revoking.len() > too_many {
        return Err("too many shards reported".into());
    }
    if let Some(s) = req
        .owned
        .iter()
        .chain(req.revoking.iter().map(|r| &r.shard))
        .find(|s| s.0 >= MAX_SHARDS)
    {
        return Err(format!("shard {s} is out of range"));
    }
    Ok(())
}

/// The typed refusal of a request whose incarnation is not the recorded one: `MEMBER_REPLACED` when another
/// process joined after it and holds the member id now (the sender must stop: rejoining would replace that
/// process in turn), `UNKNOWN_MEMBER` otherwise (its own incarnation is gone, or Redis lost it and records an
/// older join: rejoin).
fn refusal(meta: &protocol::metadata::GroupMetadata, req: &HeartbeatRequest) -> Status {
    match meta.members.get(&req.member_id) {
        Some(m) if m.instance_id != req.instance_id && m.incarnation > req.incarnation => Status::MemberReplaced,
        _ => Status::UnknownMember,
    }
}

/// Why a request's incarnation is refused, for people.
fn not_recorded(req: &HeartbeatRequest, why: Stale) -> String {
    let id = &req.member_id;
    match why {
        Stale::NoMember => {
            format!("member {id} is not in the group (expired, removed, or lost with a Redis rollback)")
        }
        Stale::Replaced { recorded } => format!(
            "incarnation {} of member {id} (instance {}) is not the group's: it records incarnation {recorded} (this \
             one left, was replaced by a later join, or was lost with a Redis rollback)",
            req.incarnation, req.instance_id
        ),
        Stale::EarlierJoin { recorded } => format!(
            "a late copy of an earlier join of member {id} (naming incarnation {}): the group records incarnation \
             {recorded}",
            req.incarnation
        ),
    }
}

/// Current epoch; or the previous one with nothing owned beyond what is assigned now (the answer that bumped
/// the epoch was lost); or, inside a correction round, an epoch from the lost history (the answer will carry the
/// recorded one). The request already named the recorded incarnation, so a higher epoch is this incarnation's
/// own, never another process's.
fn epoch_accepted(tx: &Tx<'_>, member: &MemberRecord, req: &HeartbeatRequest, now: u64) -> bool {
    if req.member_epoch == member.epoch {
        return true;
    }
    if Some(req.member_epoch) == member.previous_epoch {
        let assigned: BTreeSet<ShardId> = view(tx.get(), &req.member_id, now).assigned.into_iter().collect();
        return req.owned.iter().all(|s| assigned.contains(s));
    }
    req.member_epoch > member.epoch && correction::is_open(tx)
}

/// A new incarnation: a first join, a rejoin after fencing, expiry or a give-back, or another process with the
/// same member id.
fn join(tx: &mut Tx<'_>, req: &HeartbeatRequest, now: u64) {
    let id = &req.member_id;
    // The predecessor may read the shards the member owns until its lease (or its own hold) ends. Not when it is
    // this process's own live incarnation, named by the join: the process stopped its readers before it sent
    // the join (the SDK's order, as for a leave whose every shard is REVOKED), so the new incarnation inherits
    // only a hold the old one was under. A fenced record keeps the lease hold: its process was not keeping up.
    let hold = tx.get().members.get(id).map(|old| {
        let own =
            old.instance_id == req.instance_id && old.incarnation == req.incarnation && old.fenced_at_ms.is_none();
        let lease = if own { 0 } else { lease_end(id, old, tx.liveness()) };
        lease.max(old.hold_until_ms.unwrap_or(0))
    });
    let ttl = tx.get().timings.member_ttl_ms;
    let minted = incarnation::mint(tx.get(), req.incarnation, now);
    tx.get_mut().last_incarnation = minted;
    let record = MemberRecord {
        instance_id: req.instance_id.clone(),
        incarnation: minted,
        joined_after: req.incarnation,
        epoch: MemberEpoch::JOIN,
        previous_epoch: None,
        joined_at_ms: now,
        lease_until_ms: now.saturating_add(ttl),
        fenced_at_ms: None,
        hold_until_ms: hold.filter(|h| *h > now),
        revoking_since_ms: None,
    };
    tx.get_mut().members.insert(id.clone(), record);
    tx.events.push(Event::MemberJoined(id.clone()));
    // The predecessor may still run handlers with the tokens of the shards it owns: the new incarnation gets
    // higher ones (it reads those shards only after the hold, but the tokens are settled here, once).
    fencing::mint_where(tx, now, |s| s.owner.as_ref() == Some(id));
    target::recompute(tx, true);
    let epoch = MemberEpoch::from(tx.get().assignment_epoch);
    tx.get_mut().members.get_mut(id).expect("inserted above").epoch = epoch;
}

/// Moves the member to the current assignment epoch once it has nothing left to drain (so a lost answer never
/// leaves the member with an epoch the coordinator has already moved past twice).
fn advance_epoch(tx: &mut Tx<'_>, id: &MemberId, now: u64) {
    let target_epoch = MemberEpoch::from(tx.get().assignment_epoch);
    let Some(member) = tx.get().members.get(id) else { return };
    if member.epoch < target_epoch && !has_revokes(tx.get(), id, now) && !is_held(member, now) {
        let m = tx.get_mut().members.get_mut(id).expect("checked above");
        m.previous_epoch = Some(m.epoch);
        m.epoch = target_epoch;
    }
}

/// Shards the member reports reading or draining.
fn listed_shards(req: &HeartbeatRequest) -> BTreeSet<ShardId> {
    let draining = req
        .revoking
        .iter()
        .filter(|r| r.state == RevokeState::Draining)
        .map(|r| r.shard);
    req.owned.iter().copied().chain(draining).collect()
}

/// Shards the member reports reading or draining that Redis records for another owner.
fn foreign_claims(tx: &Tx<'_>, req: &HeartbeatRequest) -> Vec<ShardId> {
    let meta = tx.get();
    listed_shards(req)
        .into_iter()
        .filter(|s| {
            meta.shards
                .get(s.index())
                .is_some_and(|r| r.owner.as_ref() != Some(&req.member_id))
        })
        .collect()
}

/// Leave: only the incarnation it names may leave, so a late leave never removes a later join of the same name
/// (a process that gave its shards back and rejoined, or its replacement). The SDK sends it after stopping every
/// reader, so its shards are released at once; if a predecessor may still be reading, the member is fenced
/// instead and removed when the hold ends.
fn leave(mut tx: Tx<'_>, req: &HeartbeatRequest, now: u64) -> Transition {
    let id = &req.member_id;
    let left = Answer::Left {
        id: id.clone(),
        incarnation: req.incarnation,
    };
    let Some(member) = tx.get().members.get(id) else {
        // Already gone: leaving is idempotent.
        return tx.finish(None, left, now);
    };
    if member.instance_id != req.instance_id || member.incarnation != req.incarnation {
        let why = Stale::Replaced {
            recorded: member.incarnation,
        };
        let msg = format!("{}; the leave changes nothing", not_recorded(req, why));
        let status = refusal(tx.get(), req);
        return tx.finish(None, Answer::reject(status, msg, None), now);
    }
    if let Some(hold) = member.hold_until_ms.filter(|h| *h > now) {
        let m = tx.get_mut().members.get_mut(id).expect("checked above");
        m.fenced_at_ms = Some(now);
        m.lease_until_ms = hold;
        tx.events.push(Event::MemberFenced {
            member: id.clone(),
            reason: "left while a predecessor was held",
        });
    } else {
        tx.remove_member(id);
        tx.events.push(Event::MemberLeft(id.clone()));
    }
    target::recompute(&mut tx, true);
    settle(&mut tx, now);
    tx.finish(None, left, now)
}
