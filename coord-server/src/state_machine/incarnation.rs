//! Incarnations: which process, and which join of it, a request speaks for.
//!
//! A member id is a name. A new process may take it (a restart, a replacement while the old one is stalled), and
//! so may the same process after it gave its shards back. Ownership, tokens and leases must follow the join, not
//! the name, or a late request of an earlier join acts on a later one (a late leave removes a rejoined member; an
//! old process and its replacement read with the same token). So every join creates an incarnation, minted here,
//! and every other request names one (see `docs/protocol.md`, "Incarnations"):
//!
//! * a heartbeat, an acknowledgement or a leave is applied only to the incarnation it names; one that names
//!   another changes nothing and gets `UNKNOWN_MEMBER`;
//! * a join names the last incarnation its process held: naming the one that created the record again (same
//!   process) is a retry of that join, naming an older one a late copy of an earlier join, and anything else
//!   (another process, the recorded incarnation itself, one Redis lost, a fenced record) a new incarnation.
//!
//! Minting follows the fencing tokens' rule (`fencing.rs`): `max(last + 1, now, named + 1)`, so a number is never
//! minted twice in one history and, after a Redis rollback, stays above the lost history's numbers as long as the
//! clocks agree. A collision across a rollback would still need the same process id: the record is matched on
//! both.

use protocol::messages::HeartbeatRequest;
use protocol::metadata::{GroupMetadata, MemberRecord};
use protocol::Incarnation;

use super::bounds::LOST_HISTORY_SLACK;

/// What a request's named incarnation means against the group's record of its member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity<'a> {
    /// The request speaks for the recorded incarnation.
    Current(&'a MemberRecord),
    /// A join that creates a new incarnation.
    NewJoin,
    /// The same join again (its answer was lost): answer what is recorded.
    RetriedJoin,
    /// The request names an incarnation the group does not record for the member (or the member is absent).
    NotRecorded(Stale),
}

/// Why a request's incarnation is not the recorded one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// No record of the member id.
    NoMember,
    /// Another incarnation holds the member id now (`recorded`), from this or another process.
    Replaced {
        /// The recorded incarnation.
        recorded: Incarnation,
    },
    /// A late copy of an earlier join of the recorded process.
    EarlierJoin {
        /// The recorded incarnation.
        recorded: Incarnation,
    },
}

/// The largest incarnation a request may name: at most `now + LOST_HISTORY_SLACK` (what a lost history can have
/// minted, as for versions), and never above what JSON carries exactly.
pub fn ceiling(meta: &GroupMetadata, now_ms: u64) -> Incarnation {
    let base = meta.last_incarnation.0.max(now_ms);
    Incarnation(base.saturating_add(LOST_HISTORY_SLACK).min(Incarnation::MAX.0 / 2))
}

/// Identifies the incarnation a non-leave request speaks for (`req.member_epoch` 0: a join).
pub fn identify<'a>(meta: &'a GroupMetadata, req: &HeartbeatRequest) -> Identity<'a> {
    let recorded = meta.members.get(&req.member_id);
    if req.member_epoch.is_join() {
        let Some(m) = recorded else { return Identity::NewJoin };
        if m.instance_id != req.instance_id {
            // Another process takes the name over (its predecessor is held until its lease ends).
            return Identity::NewJoin;
        }
        if req.incarnation < m.joined_after {
            return Identity::NotRecorded(Stale::EarlierJoin {
                recorded: m.incarnation,
            });
        }
        if req.incarnation == m.joined_after && m.fenced_at_ms.is_none() {
            return Identity::RetriedJoin;
        }
        // The process gave up the recorded incarnation (or Redis lost later ones it held, or it is fenced).
        return Identity::NewJoin;
    }
    match recorded {
        None => Identity::NotRecorded(Stale::NoMember),
        Some(m) if m.instance_id == req.instance_id && m.incarnation == req.incarnation => Identity::Current(m),
        Some(m) => Identity::NotRecorded(Stale::Replaced {
            recorded: m.incarnation,
        }),
    }
}

/// A new incarnation for a join that named `named`: above every incarnation of the group, above the one the
/// process held, and at least the Redis time (so it stays above a lost history's).
pub fn mint(meta: &GroupMetadata, named: Incarnation, now_ms: u64) -> Incarnation {
    let next = meta.last_incarnation.next().max(Incarnation(now_ms)).max(named.next());
    next.min(Incarnation::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::metadata::GroupTimings;
    use protocol::names::{GroupName, MemberId, StreamName};
    use protocol::{MemberEpoch, MetadataVersion, RoutingVersion};

    fn group() -> GroupMetadata {
        let mut meta = GroupMetadata::new(
            StreamName::new("s").unwrap(),
            GroupName::new("g").unwrap(),
            2,
            RoutingVersion(1),
            GroupTimings::default(),
            0,
        );
        meta.last_incarnation = Incarnation(5_000);
        meta.members.insert(
            MemberId::new("m").unwrap(),
            MemberRecord {
                instance_id: "p1".into(),
                incarnation: Incarnation(5_000),
                joined_after: Incarnation(4_000),
                epoch: MemberEpoch(3),
                previous_epoch: None,
                joined_at_ms: 5_000,
                lease_until_ms: 15_000,
                fenced_at_ms: None,
                hold_until_ms: None,
                revoking_since_ms: None,
            },
        );
        meta
    }

    fn req(instance: &str, incarnation: u64, epoch: i64) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: MemberId::new("m").unwrap(),
            instance_id: instance.into(),
            incarnation: Incarnation(incarnation),
            member_epoch: MemberEpoch(epoch),
            metadata_version: MetadataVersion(1),
            max_observed_version: MetadataVersion(1),
            owned: vec![],
            revoking: vec![],
            max_routing_version: protocol::RoutingVersion(0),
            max_shard_count: 0,
        }
    }

    #[test]
    fn a_heartbeat_is_applied_only_to_the_incarnation_it_names() {
        let meta = group();
        assert!(matches!(identify(&meta, &req("p1", 5_000, 3)), Identity::Current(_)));
        // The process's earlier incarnation, a later one Redis lost, another process with the same number.
        for r in [req("p1", 4_000, 3), req("p1", 6_000, 3), req("p2", 5_000, 3)] {
            assert_eq!(
                identify(&meta, &r),
                Identity::NotRecorded(Stale::Replaced {
                    recorded: Incarnation(5_000)
                }),
                "{r:?}"
            );
        }
        let mut empty = meta.clone();
        empty.members.clear();
        assert_eq!(
            identify(&empty, &req("p1", 5_000, 3)),
            Identity::NotRecorded(Stale::NoMember)
        );
    }

    #[test]
    fn a_join_is_a_retry_a_late_copy_or_a_new_incarnation() {
        let meta = group();
        assert_eq!(identify(&meta, &req("p1", 4_000, 0)), Identity::RetriedJoin);
        assert_eq!(
            identify(&meta, &req("p1", 3_999, 0)),
            Identity::NotRecorded(Stale::EarlierJoin {
                recorded: Incarnation(5_000)
            })
        );
        // Gave the recorded incarnation back; held one Redis lost; another process.
        for r in [req("p1", 5_000, 0), req("p1", 7_000, 0), req("p2", 0, 0)] {
            assert_eq!(identify(&meta, &r), Identity::NewJoin, "{r:?}");
        }
        let mut fenced = meta.clone();
        fenced.members.values_mut().for_each(|m| m.fenced_at_ms = Some(6_000));
        assert_eq!(identify(&fenced, &req("p1", 4_000, 0)), Identity::NewJoin);
    }

    #[test]
    fn minted_incarnations_grow_past_the_group_the_clock_and_the_named_one() {
        let meta = group();
        assert_eq!(mint(&meta, Incarnation(0), 1_000), Incarnation(5_001));
        assert_eq!(mint(&meta, Incarnation(0), 9_000), Incarnation(9_000));
        assert_eq!(mint(&meta, Incarnation(12_000), 9_000), Incarnation(12_001));
        let mut full = meta.clone();
        full.last_incarnation = Incarnation::MAX;
        assert_eq!(mint(&full, Incarnation::MAX, u64::MAX), Incarnation::MAX);
        assert!(ceiling(&meta, u64::MAX) < Incarnation::MAX);
    }
}
