//! The expiry grace and the suspicion of lost writes, decided from what one load shows and what this process
//! remembers of the group.
//!
//! Liveness facts or metadata writes may be lost behind this process's back (it just started, Redis restarted or
//! failed over, the liveness hash was deleted or evicted, the stored version went below one it saw). Then no
//! member may be expired for one member TTL, and the transition opens a correction round
//! ([`Clock::suspected_loss`]). Pure: the caller logs and counts the [`Suspicion`]s.

use protocol::metadata::GroupMetadata;
use protocol::MetadataVersion;

use super::transition::Clock;

/// What this process remembers of a group from earlier loads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Remembered {
    /// The highest metadata version this process has seen for the group.
    pub highest: MetadataVersion,
    /// No expiry before this Redis time; `None`: the group was never loaded by this process.
    pub grace_until_ms: Option<u64>,
}

/// What one load of the group shows besides the metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Redis time of the load, in ms.
    pub now_ms: u64,
    /// The stored metadata was last written under another Redis run id (restart or failover).
    pub run_id_changed: bool,
    /// The liveness hash does not exist.
    pub liveness_missing: bool,
    /// No expiry anywhere before this Redis time (this process noticed a Redis restart).
    pub global_grace_until_ms: u64,
}

/// Why a load makes this process suspect lost writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspicion {
    /// The stored version is below one this process saw, and no open correction round accounts for it.
    Regressed {
        /// The stored version.
        stored: MetadataVersion,
        /// The highest version this process saw.
        seen: MetadataVersion,
    },
    /// The metadata outlived a Redis restart or failover.
    RunIdChanged,
    /// The liveness hash is missing while the group has members: every join wrote an entry, so it was deleted
    /// or evicted, not empty.
    LivenessMissing,
}

/// The verdict on one load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    /// The clock of the transition.
    pub clock: Clock,
    /// What to remember of the group from now on.
    pub remembered: Remembered,
    /// What was suspected, in the order checked.
    pub suspicions: Vec<Suspicion>,
}

/// Decides the grace and the suspected loss of a transition on `meta`, loaded as `loaded` says.
pub fn assess(meta: &GroupMetadata, remembered: Remembered, loaded: Loaded) -> Assessment {
    let ttl = meta.timings.member_ttl_ms;
    let now = loaded.now_ms;
    // First sight of the group by this process: liveness facts may predate this process.
    let mut grace = remembered.grace_until_ms.unwrap_or(now + ttl);
    let highest = remembered.highest;
    let stored = meta.metadata_version;
    let mut suspected_loss = None;
    let mut suspicions = Vec::new();
    let round_covers = meta
        .correction
        .as_ref()
        .is_some_and(|r| r.reported_max_version >= highest);
    if stored < highest && !round_covers {
        suspicions.push(Suspicion::Regressed { stored, seen: highest });
        grace = grace.max(now + ttl);
        suspected_loss = Some(highest);
    }
    if loaded.run_id_changed {
        suspicions.push(Suspicion::RunIdChanged);
        grace = grace.max(now + ttl);
        suspected_loss = Some(suspected_loss.unwrap_or(stored).max(stored));
    }
    if loaded.liveness_missing && !meta.members.is_empty() {
        suspicions.push(Suspicion::LivenessMissing);
        grace = grace.max(now + ttl);
        suspected_loss = Some(suspected_loss.unwrap_or(stored).max(stored));
    }
    Assessment {
        clock: Clock {
            now_ms: now,
            expiry_allowed_from_ms: grace.max(loaded.global_grace_until_ms),
            suspected_loss,
        },
        remembered: Remembered {
            highest: highest.max(stored),
            grace_until_ms: Some(grace),
        },
        suspicions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::metadata::{CorrectionRound, GroupMetadata, GroupTimings, MemberRecord};
    use protocol::names::{GroupName, MemberId, StreamName};
    use protocol::{MemberEpoch, RoutingVersion};

    const NOW: u64 = 100_000;

    fn group(version: u64) -> GroupMetadata {
        let mut meta = GroupMetadata::new(
            StreamName::new("s").unwrap(),
            GroupName::new("g").unwrap(),
            4,
            RoutingVersion(1),
            GroupTimings::default(),
            0,
        );
        meta.metadata_version = MetadataVersion(version);
        meta
    }

    fn ttl(meta: &GroupMetadata) -> u64 {
        meta.timings.member_ttl_ms
    }

    fn known(highest: u64, grace_until_ms: u64) -> Remembered {
        Remembered {
            highest: MetadataVersion(highest),
            grace_until_ms: Some(grace_until_ms),
        }
    }

    fn at_now() -> Loaded {
        Loaded {
            now_ms: NOW,
            ..Loaded::default()
        }
    }

    #[test]
    fn first_sight_grants_one_member_ttl_of_grace() {
        let meta = group(3);
        let a = assess(&meta, Remembered::default(), at_now());
        assert_eq!(a.clock.expiry_allowed_from_ms, NOW + ttl(&meta));
        assert_eq!(a.clock.suspected_loss, None);
        assert!(a.suspicions.is_empty());
        assert_eq!(a.remembered, known(3, NOW + ttl(&meta)));
    }

    #[test]
    fn a_known_group_keeps_its_remembered_grace() {
        let meta = group(3);
        let a = assess(&meta, known(3, 5), at_now());
        assert_eq!(
            a.clock,
            Clock {
                now_ms: NOW,
                expiry_allowed_from_ms: 5,
                suspected_loss: None
            }
        );
        assert!(a.suspicions.is_empty());
    }

    #[test]
    fn a_regression_below_a_seen_version_suspects_the_seen_one() {
        let meta = group(3);
        let a = assess(&meta, known(7, 5), at_now());
        assert_eq!(
            a.suspicions,
            vec![Suspicion::Regressed {
                stored: MetadataVersion(3),
                seen: MetadataVersion(7)
            }]
        );
        assert_eq!(a.clock.suspected_loss, Some(MetadataVersion(7)));
        assert_eq!(a.clock.expiry_allowed_from_ms, NOW + ttl(&meta));
        assert_eq!(
            a.remembered.highest,
            MetadataVersion(7),
            "the highest seen never goes down"
        );
    }

    #[test]
    fn an_open_round_that_covers_the_seen_version_is_no_new_regression() {
        let mut meta = group(3);
        meta.correction = Some(CorrectionRound {
            started_at_ms: 0,
            reported_max_version: MetadataVersion(7),
            synced: Default::default(),
            claims: Default::default(),
        });
        let a = assess(&meta, known(7, 5), at_now());
        assert!(a.suspicions.is_empty());
        assert_eq!(a.clock.suspected_loss, None);
        assert_eq!(a.clock.expiry_allowed_from_ms, 5);
    }

    #[test]
    fn a_redis_restart_suspects_the_stored_version() {
        let meta = group(3);
        let loaded = Loaded {
            run_id_changed: true,
            ..at_now()
        };
        let a = assess(&meta, known(3, 5), loaded);
        assert_eq!(a.suspicions, vec![Suspicion::RunIdChanged]);
        assert_eq!(a.clock.suspected_loss, Some(MetadataVersion(3)));
        assert_eq!(a.clock.expiry_allowed_from_ms, NOW + ttl(&meta));
        // With a regression too, the higher of the two is suspected.
        let a = assess(&meta, known(9, 5), loaded);
        assert_eq!(a.clock.suspected_loss, Some(MetadataVersion(9)));
    }

    #[test]
    fn a_missing_liveness_hash_counts_only_when_the_group_has_members() {
        let mut meta = group(3);
        let loaded = Loaded {
            liveness_missing: true,
            ..at_now()
        };
        let a = assess(&meta, known(3, 5), loaded);
        assert!(a.suspicions.is_empty(), "an empty group has no liveness hash");
        assert_eq!(a.clock.expiry_allowed_from_ms, 5);
        let record = MemberRecord {
            instance_id: "i".into(),
            incarnation: protocol::Incarnation::NONE,
            joined_after: protocol::Incarnation::NONE,
            epoch: MemberEpoch::JOIN,
            previous_epoch: None,
            joined_at_ms: 0,
            lease_until_ms: 0,
            fenced_at_ms: None,
            hold_until_ms: None,
            revoking_since_ms: None,
        };
        meta.members.insert(MemberId::new("m").unwrap(), record);
        let a = assess(&meta, known(3, 5), loaded);
        assert_eq!(a.suspicions, vec![Suspicion::LivenessMissing]);
        assert_eq!(a.clock.suspected_loss, Some(MetadataVersion(3)));
        assert_eq!(a.clock.expiry_allowed_from_ms, NOW + ttl(&meta));
    }

    #[test]
    fn the_global_grace_holds_expiry_back_too() {
        let meta = group(3);
        let loaded = Loaded {
            global_grace_until_ms: NOW + 1,
            ..at_now()
        };
        let a = assess(&meta, known(3, 5), loaded);
        assert_eq!(a.clock.expiry_allowed_from_ms, NOW + 1);
        assert_eq!(
            a.remembered.grace_until_ms,
            Some(5),
            "the global grace is not the group's"
        );
    }
}
