//! Periodic work and admin fencing.
//!
//! A tick changes nothing unless something is due, so the coordinator can run it often without writing:
//! * members whose lease ran out (fenced or not) are removed and their shards released, never during a grace
//!   period;
//! * members past their rebalance timeout with shards still to drain are fenced: no more renewals, and their
//!   shards move when the lease they were last granted ends (the same bound as expiry);
//! * in a correction round, members still claiming a shard, or not yet synced, after the rebalance timeout are
//!   fenced likewise;
//! * a predecessor's hold that ended is cleared (its shards become the new incarnation's to read or revoke);
//! * a different stream routing is adopted (shards are only ever added), opening a reshard that holds the new
//!   shards until the group drained their parents (`reshard`), and seals the routing recorded are copied;
//! * a correction round whose conditions hold is closed.

use protocol::metadata::{GroupMetadata, ShardRecord, StreamRouting};
use protocol::names::MemberId;

use super::lease::{is_expired, is_held, lease_end, rebalance_timed_out};
use super::reconcile::settle;
use super::transition::{Answer, Clock, Event, Liveness, Transition, Tx};
use super::{correction, reshard, target};
use protocol::Status;

pub(super) fn tick(
    meta: &GroupMetadata,
    liveness: &Liveness,
    routing: Option<&StreamRouting>,
    clock: Clock,
) -> Transition {
    let now = clock.now_ms;
    let mut tx = Tx::new(meta, liveness);
    tx.open_round_if_suspected(clock);
    let mut membership_changed = false;

    let expired: Vec<MemberId> = meta
        .members
        .iter()
        .filter(|(id, m)| is_expired(id, m, liveness, clock))
        .map(|(id, _)| id.clone())
        .collect();
    for id in expired {
        tx.remove_member(&id);
        tx.events.push(Event::MemberExpired(id));
        membership_changed = true;
    }

    membership_changed |= fence_overdue(&mut tx, meta, now);

    let ended: Vec<MemberId> = tx
        .get()
        .members
        .iter()
        .filter(|(_, m)| m.hold_until_ms.is_some_and(|h| now >= h))
        .map(|(id, _)| id.clone())
        .collect();
    for id in ended {
        end_hold(&mut tx, &id);
    }

    if let Some(r) = routing.filter(|r| r.routing_version != meta.routing_version) {
        membership_changed |= adopt_routing(&mut tx, meta, r, now);
    }

    if let Some(r) = routing {
        reshard::copy_seals(&mut tx, r);
    }
    reshard::release(&mut tx, now);

    if membership_changed {
        target::recompute(&mut tx, true);
    }
    settle(&mut tx, now);
    correction::try_close(&mut tx, now);
    tx.finish(None, Answer::Done, now)
}

/// Fences the members that let their rebalance run out, or that hold an overdue correction round open. Whether
/// any was fenced.
fn fence_overdue(tx: &mut Tx<'_>, meta: &GroupMetadata, now: u64) -> bool {
    let timeout = meta.timings.rebalance_timeout_ms;
    let round_overdue = meta
        .correction
        .as_ref()
        .is_some_and(|r| now >= r.started_at_ms.saturating_add(timeout));
    let to_fence: Vec<(MemberId, &'static str)> = tx
        .get()
        .members
        .iter()
        .filter(|(_, m)| m.fenced_at_ms.is_none())
        .filter_map(|(id, m)| {
            if rebalance_timed_out(m, timeout, now) {
                Some((id.clone(), "rebalance timeout"))
            } else if round_overdue && !is_held(m, now) && claims_of(tx.get(), id) {
                // A held member's claims are its predecessor's: they end with the hold, not by fencing.
                Some((id.clone(), "correction round claim not released"))
            } else if round_overdue && !synced(tx.get(), id) {
                // A live member adopts the stored view within one heartbeat; one that keeps sending another
                // version (a buggy client) would otherwise hold the round open for ever.
                Some((id.clone(), "correction round: stored metadata not adopted"))
            } else {
                None
            }
        })
        .collect();
    let fenced = !to_fence.is_empty();
    for (id, reason) in to_fence {
        fence(tx, &id, reason, now);
    }
    fenced
}

/// Adopts a routing of another version, or refuses it; whether the group adopted it. Any other routing version is
/// adopted, not only a higher one: a routing hash lost and recreated starts its versions again, and a group
/// holding out for a higher number would never read the shards producers now use. Shards are never removed, so a
/// routing with fewer shards is refused.
fn adopt_routing(tx: &mut Tx<'_>, meta: &GroupMetadata, r: &StreamRouting, now: u64) -> bool {
    if r.shard_count >= meta.shard_count && reshard::adopt(tx, r, meta.shard_count, now) {
        let next = tx.get_mut();
        next.routing_version = r.routing_version;
        next.shards.resize(r.shard_count as usize, ShardRecord::default());
        next.shard_count = r.shard_count;
        tx.events.push(Event::RoutingAdopted {
            version: r.routing_version,
            shard_count: r.shard_count,
        });
        true
    } else {
        tx.events.push(Event::RoutingRefused {
            version: r.routing_version,
        });
        false
    }
}

/// Admin fencing: the member gets FENCED_MEMBER_EPOCH from now on; its shards move when its lease ends.
pub(super) fn fence_by_admin(meta: &GroupMetadata, liveness: &Liveness, id: &MemberId, clock: Clock) -> Transition {
    let now = clock.now_ms;
    let mut tx = Tx::new(meta, liveness);
    tx.open_round_if_suspected(clock);
    match meta.members.get(id) {
        None => {
            let msg = format!("member {id} is not in the group");
            tx.finish(None, Answer::reject(Status::UnknownMember, msg, None), now)
        }
        Some(m) if m.fenced_at_ms.is_some() => tx.finish(None, Answer::Done, now),
        Some(_) => {
            fence(&mut tx, id, "admin", now);
            target::recompute(&mut tx, true);
            settle(&mut tx, now);
            tx.finish(None, Answer::Done, now)
        }
    }
}

fn synced(meta: &GroupMetadata, id: &MemberId) -> bool {
    meta.correction.as_ref().is_none_or(|r| r.synced.contains(id))
}

fn claims_of(meta: &GroupMetadata, id: &MemberId) -> bool {
    meta.correction
        .as_ref()
        .is_some_and(|r| r.claims.values().any(|c| c.contains(id)))
}

/// Stops renewing the member's lease; it stays (owning its shards) until the lease it was last granted ends.
fn fence(tx: &mut Tx<'_>, id: &MemberId, reason: &'static str, now: u64) {
    let lease = lease_end(id, &tx.get().members[id], tx.liveness());
    let now_fenced = tx.get().members[id].fenced_at_ms.is_none();
    if now_fenced {
        let m = tx.get_mut().members.get_mut(id).expect("listed");
        m.fenced_at_ms = Some(now);
        m.lease_until_ms = lease;
        tx.events.push(Event::MemberFenced {
            member: id.clone(),
            reason,
        });
    }
}

/// The predecessor's lease is over. From the hold's end the member's view already treats the shards it owns as
/// its own (readable where targeted, to be revoked elsewhere), so the tick only clears the field: releasing here
/// could take a shard from under the new incarnation, which may have started reading it at the hold's end.
fn end_hold(tx: &mut Tx<'_>, id: &MemberId) {
    tx.get_mut().members.get_mut(id).expect("listed").hold_until_ms = None;
    // What the predecessor claimed in a correction round ended with its lease.
    correction::forget_claims(tx, id);
}
