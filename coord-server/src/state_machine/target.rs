//! Target assignment: runs the assignor over the eligible members and records the result.

use protocol::names::MemberId;
use std::collections::HashMap;

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
    // Each shard's target as its member's number among `eligible` (`GONE` for a member no longer eligible): one
    // hash per shard, not a search of ids. Neighbouring shards mostly share a target: one comparison then.
    let number: HashMap<&MemberId, usize> = eligible.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut last: Option<(&MemberId, usize)> = None;
    let current: Vec<Option<usize>> = meta
        .shards
        .iter()
        .map(|s| {
            let t = s.target.as_ref()?;
            let i = match last {
                Some((id, i)) if id == t => i,
                _ => number.get(t).copied().unwrap_or(GONE),
            };
            last = Some((t, i));
            Some(i)
        })
        .collect();
    let targets = assignor::assign_indices(meta.shard_count, eligible.len(), &current);
    let moved: Vec<(usize, Option<MemberId>)> = targets
        .iter()
        .zip(&current)
        .enumerate()
        .filter(|(_, (t, c))| t != c)
        .map(|(shard, (t, _))| (shard, t.map(|i| eligible[i].clone())))
        .collect();
    if !moved.is_empty() || membership_changed {
        let next = tx.get_mut();
        for (shard, target) in moved {
            next.shards[shard].target = target;
        }
        next.assignment_epoch = next.assignment_epoch.next();
    }
}

/// The number [`recompute`] gives a target that is no longer eligible: above every member's.
const GONE: usize = usize::MAX;
