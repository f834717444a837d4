//! The metadata correction round: SYNC_METADATA -> REVOKE_PENDING -> OK.
//!
//! Redis may lose recent writes. A client that reports a version above the stored one (or reads a shard Redis
//! records for someone else) is evidence that decisions were lost. Redis stays the source of truth: the
//! coordinator opens a round instead of rebuilding anything, and
//! * answers SYNC_METADATA (the stored view) to every member whose heartbeat carries another version;
//! * marks a member synced once it heartbeats with the stored version, and answers REVOKE_PENDING while the round
//!   is open: members keep the shards they already read that are still assigned, and start nothing new;
//! * closes the round, and answers OK again, when every live member is synced, no member still claims a shard
//!   Redis records for someone else, and one member TTL has passed since the round opened (members that joined in
//!   the lost history are unknown to Redis; their leases, granted before the loss, have run out by then).
//!
//! The round is recorded in the aggregate but holds `metadataVersion` still: bumping it would hand out the very
//! version numbers the clients saw in the lost history. When the round closes the version moves past the highest
//! reported one: the lost numbers are retired, never reused for other content. That is not "bumping Redis to match
//! a client": nothing is rebuilt from client reports, and it happens only after every live member adopted what
//! Redis holds.

use protocol::names::MemberId;
use protocol::{MetadataVersion, ShardId};
use std::collections::BTreeSet;

use protocol::metadata::CorrectionRound;

use super::transition::{Event, Tx};
use super::{bounds, fencing};

/// Opens a round, or feeds the open one. A higher reported version raises the version retired at the close.
/// Only the coordinator's own evidence of a new loss (`restart_wait`: a Redis run id change, or a version it saw
/// itself) restarts the one-TTL wait, for leases granted in the newly lost history. A client's report does not:
/// a loss it reveals happened before it was sent, so the leases of that history end within one TTL of the round's
/// start, and otherwise a client reporting ever higher versions would hold the round open for ever.
pub fn open(tx: &mut Tx<'_>, reported: MetadataVersion, now_ms: u64, restart_wait: bool) {
    match &tx.get().correction {
        None => {
            tx.get_mut().correction = Some(CorrectionRound {
                started_at_ms: now_ms,
                reported_max_version: reported,
                synced: BTreeSet::new(),
                claims: Default::default(),
            });
            tx.events.push(Event::CorrectionOpened {
                reported,
                stored: tx.get().metadata_version,
            });
        }
        Some(round) if reported > round.reported_max_version || (restart_wait && round.started_at_ms < now_ms) => {
            let round = tx.get_mut().correction.as_mut().expect("matched Some");
            round.reported_max_version = round.reported_max_version.max(reported);
            if restart_wait {
                round.started_at_ms = round.started_at_ms.max(now_ms);
            }
        }
        Some(_) => {}
    }
}

/// Whether a round is open.
pub fn is_open(tx: &Tx<'_>) -> bool {
    tx.get().correction.is_some()
}

/// Records that `id` heartbeated with the stored version.
pub fn mark_synced(tx: &mut Tx<'_>, id: &MemberId) {
    if tx.get().correction.as_ref().is_some_and(|r| !r.synced.contains(id)) {
        tx.get_mut()
            .correction
            .as_mut()
            .expect("checked")
            .synced
            .insert(id.clone());
    }
}

/// Records shards `id` reads or drains although Redis records another owner.
pub fn record_claims(tx: &mut Tx<'_>, id: &MemberId, shards: &[ShardId]) {
    for &shard in shards {
        let known = tx
            .get()
            .correction
            .as_ref()
            .is_some_and(|r| r.claims.get(&shard).is_some_and(|c| c.contains(id)));
        if !known {
            let round = tx
                .get_mut()
                .correction
                .as_mut()
                .expect("claims are recorded in an open round");
            round.claims.entry(shard).or_default().insert(id.clone());
            tx.events.push(Event::ForeignClaim {
                shard,
                member: id.clone(),
            });
        }
    }
}

/// Clears `id`'s claim on `shard` (it reported the shard REVOKED).
pub fn clear_claim(tx: &mut Tx<'_>, id: &MemberId, shard: ShardId) {
    let has = tx
        .get()
        .correction
        .as_ref()
        .is_some_and(|r| r.claims.get(&shard).is_some_and(|c| c.contains(id)));
    if has {
        let round = tx.get_mut().correction.as_mut().expect("checked");
        if let Some(c) = round.claims.get_mut(&shard) {
            c.remove(id);
            if c.is_empty() {
                round.claims.remove(&shard);
            }
        }
    }
}

/// Clears `id`'s claims on shards it no longer reports reading or draining (`listed`).
pub fn keep_listed_claims(tx: &mut Tx<'_>, id: &MemberId, listed: &BTreeSet<ShardId>) {
    let ended: Vec<ShardId> = tx
        .get()
        .correction
        .as_ref()
        .map(|r| {
            r.claims
                .iter()
                .filter(|(shard, c)| c.contains(id) && !listed.contains(shard))
                .map(|(shard, _)| *shard)
                .collect()
        })
        .unwrap_or_default();
    for shard in ended {
        clear_claim(tx, id, shard);
    }
}

/// Forgets a member that left the group (its claims and sync mark).
pub fn forget(tx: &mut Tx<'_>, id: &MemberId) {
    let present = tx
        .get()
        .correction
        .as_ref()
        .is_some_and(|r| r.synced.contains(id) || r.claims.values().any(|c| c.contains(id)));
    if present {
        let round = tx.get_mut().correction.as_mut().expect("checked");
        round.synced.remove(id);
        round.claims.retain(|_, c| {
            c.remove(id);
            !c.is_empty()
        });
    }
}

/// Forgets `id`'s claims (its predecessor incarnation's lease ended).
pub fn forget_claims(tx: &mut Tx<'_>, id: &MemberId) {
    if tx
        .get()
        .correction
        .as_ref()
        .is_some_and(|r| r.claims.values().any(|c| c.contains(id)))
    {
        tx.get_mut()
            .correction
            .as_mut()
            .expect("checked")
            .claims
            .retain(|_, c| {
                c.remove(id);
                !c.is_empty()
            });
    }
}

/// Members the round still waits for.
pub fn unsynced(tx: &Tx<'_>) -> Vec<MemberId> {
    let meta = tx.get();
    let Some(round) = &meta.correction else {
        return Vec::new();
    };
    meta.members
        .iter()
        .filter(|(id, m)| m.fenced_at_ms.is_none() && !round.synced.contains(*id))
        .map(|(id, _)| id.clone())
        .collect()
}

/// Closes the round when its three conditions hold. Returns whether it is closed now.
pub fn try_close(tx: &mut Tx<'_>, now_ms: u64) -> bool {
    let meta = tx.get();
    let Some(round) = &meta.correction else { return true };
    let waited = now_ms >= round.started_at_ms.saturating_add(meta.timings.member_ttl_ms);
    if waited && round.claims.is_empty() && unsynced(tx).is_empty() {
        // Retire the lost version numbers: the next version is above every version a client reported, so a number
        // never names two different contents and the clients' remembered maximum stops reopening rounds.
        // Bounded again here for rounds recorded by builds that did not bound reports.
        let retired = round
            .reported_max_version
            .min(bounds::REPORT_LIMIT)
            .max(meta.metadata_version);
        let next = tx.get_mut();
        next.metadata_version = retired;
        next.correction = None;
        // Every version of this history is retired now: a higher report, until the coordinator sees a new loss
        // itself, is one no coordinator issued (see `reportsSettled`).
        next.reports_settled = true;
        // The lost history may have minted tokens above the stored ones; one TTL after the loss the clock is above
        // them (see `fencing`), so every owner gets a fresh token now.
        fencing::mint_where(tx, now_ms, |s| s.owner.is_some());
        tx.events.push(Event::CorrectionClosed);
        true
    } else {
        false
    }
}
