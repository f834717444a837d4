//! When a group next needs a tick: the earliest Redis time at which [`super::Input::Tick`] could change anything.
//!
//! The tick loop visits only groups whose deadline has come (the due index, see `crate::due`), so this function
//! is what keeps expiry, fencing and hold ends on time: every condition under which the tick writes must be
//! covered. A tick's writing conditions, for fixed metadata and liveness, are upward closed in time (once one
//! holds it holds at every later time, see the rule list below), so "the tick at `t` writes" is `t >= D` for one
//! `D`, and this module computes that `D` exactly from the conditions' thresholds:
//! * a member's lease ends (the later of the aggregate's and the liveness hash's), and the expiry grace is over;
//! * a member not fenced has drained past its rebalance timeout (`revokingSinceMs + rebalanceTimeoutMs`);
//! * a predecessor's hold ends (`holdUntilMs`);
//! * an open correction round passes its rebalance timeout while a member not fenced is unsynced, or still claims
//!   a shard once its hold ended; or passes one member TTL with nothing left to wait for (it closes);
//! * work that does not wait for time (a free shard with a target, a drain mark or `revokingSinceMs` out of step
//!   with the table, an owner without a fencing token, a finished reshard): due at once (`Some(0)`).
//!
//! Not covered, because it is not a function of the group alone: adopting a stream routing of another version,
//! and copying seals the routing records (the coordinator marks a stream's groups due when it commits a routing),
//! and a loss suspected at load (`Clock::suspected_loss`, found by whichever section loads the group next).
//! The property test below checks the claim on generated states: at every `t < D` the tick writes nothing, at
//! `D` it writes.

use std::collections::BTreeSet;

use protocol::metadata::GroupMetadata;
use protocol::names::MemberId;

use super::lease::lease_end;
use super::reshard;
use super::transition::Liveness;

/// The earliest Redis time (ms) at which a tick of `meta` may write, with the expiry grace ending at
/// `expiry_allowed_from_ms`; `Some(0)`: at once; `None`: never, until something else writes the group.
///
/// A liveness map holding only some members' entries (a heartbeat section loads its own members') gives an
/// earlier or equal answer, never a later one: a missing entry counts as the aggregate's lease end, which is the
/// earlier of the two.
pub fn next_due_ms(meta: &GroupMetadata, liveness: &Liveness, expiry_allowed_from_ms: u64) -> Option<u64> {
    if works_without_waiting(meta) {
        return Some(0);
    }
    let timeout = meta.timings.rebalance_timeout_ms;
    let mut due = u64::MAX;
    for (id, m) in &meta.members {
        let lease = lease_end(id, m, liveness);
        if lease != u64::MAX {
            due = due.min(lease.max(expiry_allowed_from_ms));
        }
        if let Some(h) = m.hold_until_ms {
            due = due.min(h);
        }
        if m.fenced_at_ms.is_none() {
            if let Some(since) = m.revoking_since_ms {
                due = due.min(since.saturating_add(timeout));
            }
        }
    }
    if let Some(round) = &meta.correction {
        let overdue_at = round.started_at_ms.saturating_add(timeout);
        let mut unsynced = false;
        for (id, m) in meta.members.iter().filter(|(_, m)| m.fenced_at_ms.is_none()) {
            if !round.synced.contains(id) {
                unsynced = true;
                due = due.min(overdue_at);
            }
            if round.claims.values().any(|c| c.contains(id)) {
                // A held member's claims are its predecessor's: fenced for them only once the hold ended.
                due = due.min(overdue_at.max(m.hold_until_ms.unwrap_or(0)));
            }
        }
        if round.claims.is_empty() && !unsynced {
            due = due.min(round.started_at_ms.saturating_add(meta.timings.member_ttl_ms));
        }
    }
    (due != u64::MAX).then_some(due)
}

/// [`next_due_ms`], or at once while the group has open reshards: the tick also observes their parents' seals and
/// drains in Redis (`reshard::needs`), which no deadline announces. The score the due index records.
pub fn visit_due_ms(meta: &GroupMetadata, liveness: &Liveness, expiry_allowed_from_ms: u64) -> Option<u64> {
    if !reshard::needs(meta).is_empty() {
        return Some(0);
    }
    next_due_ms(meta, liveness, expiry_allowed_from_ms)
}

/// Whether the tick writes whatever the time: what `reconcile::settle` would bring in step, or a finished reshard
/// `reshard::release` would close.
fn works_without_waiting(meta: &GroupMetadata) -> bool {
    if meta.reshards.iter().any(|r| r.done()) {
        return true;
    }
    let table_unsettled = meta.shards.iter().any(|s| {
        let draining = s.owner.is_some() && s.owner != s.target;
        (s.owner.is_none() && s.target.is_some())
            || draining != s.revoke_since_version.is_some()
            || (s.owner.is_some() && s.fencing_token.0 == 0)
    });
    if table_unsettled {
        return true;
    }
    // One pass over the table, not one per member: this runs on every commit of a group of thousands of each.
    let draining: BTreeSet<&MemberId> = meta
        .shards
        .iter()
        .filter_map(|s| s.owner.as_ref().filter(|&o| s.target.as_ref() != Some(o)))
        .collect();
    meta.members
        .iter()
        .any(|(id, m)| revoking_mark_wrong(draining.contains(id), m))
}

/// Whether `settle` changes the member's `revokingSinceMs` at some time before its hold ends (after it, the hold's
/// own end is a deadline): a member with nothing to drain (`drains`: it owns a shard targeted elsewhere) must have
/// none, a member draining with no hold must have one, and a held member must have none while held.
fn revoking_mark_wrong(drains: bool, m: &protocol::metadata::MemberRecord) -> bool {
    matches!(
        (drains, m.hold_until_ms, m.revoking_since_ms),
        (false, _, Some(_)) | (true, None, None) | (true, Some(_), Some(_))
    )
}

#[cfg(test)]
#[path = "due_tests.rs"]
mod tests;
