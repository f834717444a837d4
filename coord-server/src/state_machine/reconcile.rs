//! One member's view of the shard table, and the ownership moves the table allows.
//!
//! A shard moves in two steps. The assignor changes its `target`; its `owner` changes only when the previous
//! owner released it (REVOKED ack, expiry, or removal after fencing), and then at once to the target, in the same
//! write. So for a member:
//! * `assigned`: owner and target (and no predecessor incarnation may still read it): it may read;
//! * `pending`: target but not owner (or held, or a child whose parents the group has not drained): it waits;
//! * `revoke`: owner but not target: it must drain (the DRAIN instruction).

use protocol::metadata::GroupMetadata;
use protocol::names::MemberId;
use protocol::{MetadataVersion, ShardId};
use std::collections::BTreeSet;

use super::lease::is_held;
use super::transition::{Event, Tx};
use super::{bounds, fencing, reshard};

/// What one member may do with each shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberView {
    /// May read.
    pub assigned: Vec<ShardId>,
    /// Targeted, not yet released by the previous owner.
    pub pending: Vec<ShardId>,
    /// Must drain and report REVOKED.
    pub revoke: Vec<ShardId>,
}

/// The member's view at `now_ms`.
pub fn view(meta: &GroupMetadata, id: &MemberId, now_ms: u64) -> MemberView {
    let mut v = MemberView::default();
    let held = meta.members.get(id).is_some_and(|m| is_held(m, now_ms));
    for (i, s) in meta.shards.iter().enumerate() {
        let shard = ShardId(i as u32);
        let owner = s.owner.as_ref() == Some(id);
        let target = s.target.as_ref() == Some(id);
        match (owner, target) {
            // A child of an unfinished growth waits for its parents like a shard still being released.
            (true, true) if !held && !reshard::is_held_child(meta, shard) => v.assigned.push(shard),
            (true, true) | (false, true) => v.pending.push(shard),
            (true, false) if !held => v.revoke.push(shard),
            // Held shards of a predecessor are neither readable nor revocable by this incarnation.
            _ => {}
        }
    }
    v
}

/// Whether the member still has a shard to drain.
pub fn has_revokes(meta: &GroupMetadata, id: &MemberId, now_ms: u64) -> bool {
    if meta.members.get(id).is_some_and(|m| is_held(m, now_ms)) {
        return false;
    }
    meta.shards
        .iter()
        .any(|s| s.owner.as_ref() == Some(id) && s.target.as_ref() != Some(id))
}

/// Applies a REVOKED ack sent by a client at metadata version `sent_at`: releases the shard only if `id` owns it,
/// is not its target, is not held, and was told to drain it at or before `sent_at`. Returns whether the ack was
/// accepted; a stale, duplicate or late ack changes nothing.
pub fn accept_revoked(tx: &mut Tx<'_>, id: &MemberId, shard: ShardId, sent_at: MetadataVersion, now_ms: u64) -> bool {
    let meta = tx.get();
    let Some(s) = meta.shards.get(shard.index()) else {
        return false;
    };
    let held = meta.members.get(id).is_some_and(|m| is_held(m, now_ms));
    // A request older than the drain instruction reports a release from an earlier ownership (the client
    // stopped when its lease ran out, then read the shard again): accepting it would free a shard being read.
    let before_instruction = s.revoke_since_version.is_some_and(|v| sent_at < v);
    // The model check's injected bug (tests only): it must find the split this check prevents.
    #[cfg(test)]
    let before_instruction = before_instruction && !super::model::injected(super::model::Bug::LateRevokedAck);
    if s.owner.as_ref() != Some(id) || s.target.as_ref() == Some(id) || held || before_instruction {
        return false;
    }
    tx.get_mut().shards[shard.index()].owner = None;
    tx.events.push(Event::ShardReleased {
        shard,
        from: id.clone(),
    });
    true
}

/// Releases every shard `id` owns (the member left, expired, or was removed after fencing).
pub fn release_all(tx: &mut Tx<'_>, id: &MemberId) {
    let owned: Vec<usize> = tx
        .get()
        .shards
        .iter()
        .enumerate()
        .filter(|(_, s)| s.owner.as_ref() == Some(id))
        .map(|(i, _)| i)
        .collect();
    for i in owned {
        tx.get_mut().shards[i].owner = None;
        tx.events.push(Event::ShardReleased {
            shard: ShardId(i as u32),
            from: id.clone(),
        });
    }
}

/// Brings the table to its settled form: every free shard goes to its target, and each member's
/// `revokingSinceMs` says whether it has something to drain. Writes only what differs.
pub fn settle(tx: &mut Tx<'_>, now_ms: u64) {
    let grants: Vec<usize> = tx
        .get()
        .shards
        .iter()
        .enumerate()
        .filter(|(_, s)| s.owner.is_none() && s.target.is_some())
        .map(|(i, _)| i)
        .collect();
    for i in grants {
        let shard = tx.get_mut().shards.get_mut(i).expect("index from the same table");
        shard.owner = shard.target.clone();
        let to = shard.owner.clone().expect("filtered on target.is_some()");
        fencing::mint(tx, i, now_ms);
        tx.events.push(Event::ShardGranted {
            shard: ShardId(i as u32),
            to,
        });
    }
    // The first answer that can tell an owner to drain carries the version this transition writes (held still
    // in a round).
    let announce = if tx.get().correction.is_some() {
        tx.get().metadata_version
    } else {
        bounds::bump(tx.get().metadata_version)
    };
    let marks: Vec<(usize, Option<MetadataVersion>)> = tx
        .get()
        .shards
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let draining = s.owner.is_some() && s.owner != s.target;
            match (draining, s.revoke_since_version) {
                (true, None) => Some((i, Some(announce))),
                (false, Some(_)) => Some((i, None)),
                _ => None,
            }
        })
        .collect();
    for (i, since) in marks {
        tx.get_mut().shards[i].revoke_since_version = since;
    }
    // Metadata written before fencing tokens existed: its owners get one at the first transition.
    fencing::mint_where(tx, now_ms, |s| s.owner.is_some() && s.fencing_token.0 == 0);
    // One pass over the shards (not one per member): this runs on every write of a large group.
    let meta = tx.get();
    let draining: BTreeSet<&MemberId> = meta
        .shards
        .iter()
        .filter_map(|s| s.owner.as_ref().filter(|o| s.target.as_ref() != Some(*o)))
        .filter(|o| !meta.members.get(*o).is_some_and(|m| is_held(m, now_ms)))
        .collect();
    let changes: Vec<(MemberId, Option<u64>)> = meta
        .members
        .iter()
        .filter_map(|(id, m)| match (draining.contains(id), m.revoking_since_ms) {
            (true, None) => Some((id.clone(), Some(now_ms))),
            (false, Some(_)) => Some((id.clone(), None)),
            _ => None,
        })
        .collect();
    for (id, since) in changes {
        tx.get_mut().members.get_mut(&id).expect("listed").revoking_since_ms = since;
    }
}
