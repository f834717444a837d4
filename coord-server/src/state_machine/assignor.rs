//! The uniform, sticky assignor: balance first, then stickiness, always deterministic.
//!
//! Every eligible member gets `floor(shards / members)` or one more shard. Members that already target more
//! shards get the larger quotas first, each member keeps as many of its current shards as its quota allows
//! (lowest ids first), and the shards left over go, in id order, to the members below quota, in id order.
//! The result depends only on its inputs (ordered maps, no randomness), so every coordinator replica computes the
//! same targets and a model checker can replay it.

use protocol::names::MemberId;
use protocol::ShardId;
use std::collections::BTreeMap;

/// Computes new targets for `shard_count` shards over `members` (sorted, deduplicated by the caller), given the
/// `current` target of each shard (`None` where it has none or its member is gone).
///
/// Returns one target per shard; `None` only when there are no members.
pub fn assign(shard_count: u32, members: &[&MemberId], current: &[Option<&MemberId>]) -> Vec<Option<MemberId>> {
    let index: BTreeMap<&MemberId, usize> = members.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let current: Vec<Option<usize>> = current.iter().map(|t| t.and_then(|m| index.get(m).copied())).collect();
    assign_indices(shard_count, members.len(), &current)
        .into_iter()
        .map(|t| t.map(|i| members[i].clone()))
        .collect()
}

/// [`assign`] over member indices: `members` members, numbered in id order, and each shard's `current` target as
/// such a number (`None`, or a number not below `members`, where it has none or its member is gone). What
/// [`super::target::recompute`] runs, so a group of thousands of members compares numbers, not member ids.
pub fn assign_indices(shard_count: u32, members: usize, current: &[Option<usize>]) -> Vec<Option<usize>> {
    let n = members;
    if n == 0 {
        return vec![None; shard_count as usize];
    }

    // Current shards per member (only members still eligible).
    let mut held: Vec<Vec<ShardId>> = vec![Vec::new(); n];
    for (shard, target) in current.iter().enumerate().take(shard_count as usize) {
        if let Some(i) = target.filter(|&i| i < n) {
            held[i].push(ShardId(shard as u32));
        }
    }

    // Quotas: the members holding the most get the `extra` larger quotas, which keeps movement minimal.
    let base = shard_count as usize / n;
    let extra = shard_count as usize % n;
    let mut by_holding: Vec<usize> = (0..n).collect();
    by_holding.sort_by(|a, b| held[*b].len().cmp(&held[*a].len()).then(a.cmp(b)));
    let mut quota = vec![base; n];
    for &i in by_holding.iter().take(extra) {
        quota[i] += 1;
    }

    let mut result: Vec<Option<usize>> = vec![None; shard_count as usize];
    let mut filled = vec![0usize; n];
    for i in 0..n {
        for shard in held[i].iter().take(quota[i]) {
            result[shard.index()] = Some(i);
            filled[i] += 1;
        }
    }
    let mut member_cursor = 0usize;
    for slot in result.iter_mut() {
        if slot.is_some() {
            continue;
        }
        while filled[member_cursor] >= quota[member_cursor] {
            member_cursor += 1;
        }
        *slot = Some(member_cursor);
        filled[member_cursor] += 1;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: usize) -> Vec<MemberId> {
        (0..n).map(|i| MemberId::new(format!("m{i:03}")).unwrap()).collect()
    }

    fn counts(targets: &[Option<MemberId>], members: &[MemberId]) -> Vec<usize> {
        members
            .iter()
            .map(|m| targets.iter().filter(|t| t.as_ref() == Some(m)).count())
            .collect()
    }

    #[test]
    fn no_members_no_targets() {
        assert_eq!(assign(3, &[], &[None, None, None]), vec![None, None, None]);
    }

    #[test]
    fn first_assignment_is_contiguous_and_balanced() {
        let m = ids(3);
        let refs: Vec<&MemberId> = m.iter().collect();
        let t = assign(8, &refs, &[None; 8]);
        assert_eq!(counts(&t, &m), vec![3, 3, 2]);
        assert_eq!(t[0].as_ref(), Some(&m[0]));
        assert_eq!(t[7].as_ref(), Some(&m[2]));
    }

    #[test]
    fn a_join_moves_only_the_minimum() {
        let m = ids(2);
        let refs: Vec<&MemberId> = m.iter().collect();
        let before = assign(8, &refs, &[None; 8]);
        let m3 = ids(3);
        let refs3: Vec<&MemberId> = m3.iter().collect();
        let cur: Vec<Option<&MemberId>> = before.iter().map(|t| t.as_ref()).collect();
        let after = assign(8, &refs3, &cur);
        let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        assert_eq!(moved, 2, "8 shards over 3 members: the newcomer needs 2");
        assert_eq!(counts(&after, &m3), vec![3, 3, 2]);
    }

    proptest! {
        #[test]
        fn balanced_sticky_and_deterministic(
            shards in 1u32..200,
            n_before in 1usize..12,
            n_after in 1usize..12,
        ) {
            let before_ids = ids(n_before);
            let refs: Vec<&MemberId> = before_ids.iter().collect();
            let before = assign(shards, &refs, &vec![None; shards as usize]);
            let after_ids = ids(n_after);
            let refs2: Vec<&MemberId> = after_ids.iter().collect();
            let cur: Vec<Option<&MemberId>> = before.iter()
                .map(|t| t.as_ref().filter(|m| after_ids.contains(m)))
                .collect();
            let after = assign(shards, &refs2, &cur);
            // balance
            let c = counts(&after, &after_ids);
            let (lo, hi) = (c.iter().min().unwrap(), c.iter().max().unwrap());
            prop_assert!(hi - lo <= 1);
            prop_assert!(after.iter().all(Option::is_some));
            // determinism
            prop_assert_eq!(&after, &assign(shards, &refs2, &cur));
            // stickiness: a member keeps min(previous, new quota) of its shards
            for (i, m) in after_ids.iter().enumerate() {
                let had = cur.iter().filter(|t| **t == Some(m)).count();
                let kept = cur.iter().zip(&after).filter(|(t, a)| **t == Some(m) && a.as_ref() == Some(m)).count();
                prop_assert_eq!(kept, had.min(c[i]));
            }
        }
    }
}
