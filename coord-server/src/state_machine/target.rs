//! Target assignment: runs the assignor over the eligible members and records the result.

use protocol::names::MemberId;
use std::collections::BTreeSet;

use super::assignor;
use super::transition::Tx;

/// Recomputes every shard's target. Fenced members are not eligible. Bumps the assignment epoch when the targets
/// change, or always when `membership_changed` (so a new incarnation's epoch is above every earlier one).
pub fn recompute(tx: &mut Tx<'_>, membership_changed: bool) {
    let meta = tx.get();
    let eligible: Vec<&MemberId> = meta
        .members
        .iter()
        .filter(|(_, m)| m.fenced_at_ms.is_none())
        .map(|(id, _)| id)
        .collect();
    let eligible_set: BTreeSet<&MemberId> = eligible.iter().copied().collect();
    let current: Vec<Option<&MemberId>> = meta
        .shards
        .iter()
        .map(|s| s.target.as_ref().filter(|t| eligible_set.contains(t)))
        .collect();
    let targets = assignor::assign(meta.shard_count, &eligible, &current);
    let changed = targets.iter().zip(&meta.shards).any(|(t, s)| *t != s.target);
    if changed || membership_changed {
        let next = tx.get_mut();
        for (shard, target) in next.shards.iter_mut().zip(targets) {
            shard.target = target;
        }
        next.assignment_epoch = next.assignment_epoch.next();
    }
}
