//! A stream's routing against what Redis may have forgotten of it: the producer's answer, the restoration of a
//! growth Redis lost from the routing hash, and version numbers that never come back with another meaning.
//!
//! Redis can lose the last writes of the routing hash (a failover to a replica that lagged, a restore from an older
//! snapshot, on a Cluster the failover of the one master that holds the routing) while the shards keep what the
//! coordinator wrote into them (their records, in their own hash slots: `bornVersion`, `bornParents`, the fence
//! and the seals, see `protocol::keys::shard_fence_fields`), and while clients remember the routing they saw. The
//! rules, like the metadata correction round's, only ever move the routing *up*, never rebuild it from less:
//!
//! * **Redis's own evidence is the only evidence**: shard records at and beyond the stored shard count (a growth
//!   the routing lost; [`plan`] restores it as recorded: same parents, children and seals), a fence above the
//!   stored version (a growth that had sealed its parents: producers are refused there until the routing is at
//!   least that version), and shard stream keys beyond the stored count that hold entries (what producers wrote by
//!   a layout the routing lost: restored as a growth, so no group leaves them unread).
//! * **A client's report is a hint, never evidence**: a higher version or shard count in a routing fetch, a
//!   heartbeat or a version store makes the coordinator probe Redis ([`Evidence`]), and only what the probe finds
//!   can grow, seal or retire anything. A hostile or damaged report therefore changes nothing, before or after a
//!   Redis restart; the producer that sent it is answered `SYNC_METADATA` with the stored routing.
//! * **A ceiling bounds every restoration**: the shell refuses a plan whose shard count is above the stream's
//!   ceiling (the largest shard quota of a token that may grow the stream), failing closed with nothing written.
//! * **Numbers are retired**: after any evidence of a loss, including a new Redis run id on the routing hash, the
//!   next version is `max(stored + 1, everything reported or recorded + 1, Redis now in ms)`, so a version (and the
//!   hash's revision) never names two layouts after a loss the coordinator saw.
//! * **Layouts are fenced, not only numbers**: a restore the coordinator cannot see (into the running server, or
//!   to before a failover) can still make a number name two layouts, so every seal and birth records its layout's
//!   shard count (`fenceCount`, `bornCount`) and a producer with fewer shards is refused (with jump consistent
//!   hashing a layout is its count, and a later version of one history never has fewer shards). A restoration
//!   seals every shard of the layout it commits that no growth of it seals, so every fence names its count.
//!
//! Pure: the shell reads the evidence under the routing mutex, asks [`plan`], then seals and writes records
//! ([`Plan::seals`], [`Plan::records`]) before it commits the routing.

use protocol::messages::{RoutingQuery, RoutingResponse};
use protocol::metadata::{StreamRouting, MAX_SHARDS};
use protocol::reshard::{Birth, Growth, MAX_RECORDED_GROWTHS};
use protocol::{MetadataVersion, RoutingVersion, ShardId, Status};

/// The answer to a producer's routing fetch `query` when Redis stores `stored` (after any restoration the query
/// caused). `SYNC_METADATA` when the producer still reports more than is stored: the report was not believed
/// (implausible, or a restoration already settled this history's reports) and it must adopt the stored routing.
pub fn answer(stored: &StreamRouting, query: &RoutingQuery) -> RoutingResponse {
    let regressed = query.max_observed_version > stored.routing_version
        || query.routing_version > stored.routing_version
        || query.max_shard_count > stored.shard_count;
    RoutingResponse {
        status: if regressed { Status::SyncMetadata } else { Status::Ok },
        stream: stored.stream.clone(),
        routing_version: stored.routing_version,
        shard_count: stored.shard_count,
        routing_lease_ms: stored.routing_lease_ms,
        // Three refreshes per lease: two may fail before the lease ends.
        refresh_interval_ms: (stored.routing_lease_ms / 3).max(1),
        shard_records: stored.shard_records,
    }
}

/// A client's report of the highest routing it saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Its highest routing version.
    pub version: RoutingVersion,
    /// Its highest shard count.
    pub shard_count: u32,
}

/// What the shell found besides the stored routing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evidence {
    /// The client's report that prompted the probe, if one did. Never believed: kept so the routing model check
    /// can inject the old bug of believing it ([`super::model::Bug::BelieveReports`]) and find what it breaks.
    pub report: Option<Report>,
    /// Records of the shards from the stored shard count on, consecutive, in shard order.
    pub beyond: Vec<Birth>,
    /// The shard stream keys from the stored shard count up to this one (exclusive) hold entries: written by
    /// producers of a layout the routing lost (a plain producer checks no record). At or below the stored count:
    /// none.
    pub entries_end: u32,
    /// The fence of shard 0, a parent of every growth: the highest version that sealed parents.
    pub fence: RoutingVersion,
    /// The routing hash was last written under another Redis run id (a restart or failover of its node).
    pub run_id_changed: bool,
    /// Redis time, in ms.
    pub now_ms: u64,
}

/// Why a routing was restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    /// Shard records exist beyond the stored shard count.
    RecordsBeyond,
    /// A fence is above the stored version.
    FenceAbove,
    /// Shard stream keys beyond the stored count hold entries.
    EntriesBeyond,
    /// A client reported a higher version or shard count, and it was believed: never, except under the routing
    /// model check's injected bug ([`super::model::Bug::BelieveReports`]).
    Reported,
    /// A shard the routing lists had lost its record (a Cluster failover of the record's master): written again
    /// from the routing.
    RecordLost,
}

impl Why {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::RecordsBeyond => "records_beyond",
            Why::FenceAbove => "fence_above",
            Why::EntriesBeyond => "entries_beyond",
            Why::Reported => "reported",
            Why::RecordLost => "record_lost",
        }
    }
}

/// A seal to take before the routing is committed: raise `shard`'s fence to `version` and record where it was
/// sealed. `reuse`: the growth this one restores, whose seal the parent recorded (that position stays the
/// boundary: after it, the fence refused every producer that could route a moved key there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealTodo {
    /// The growth's (new) version.
    pub version: RoutingVersion,
    /// The parent.
    pub shard: ShardId,
    /// The lost growth's version, whose recorded seal is reused when the parent has it.
    pub reuse: Option<RoutingVersion>,
    /// The shard count of the layout at `version` (`fenceCount`, written when the fence is raised).
    pub count: u32,
}

/// A restoration: the routing to commit once the seals and records are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The next routing; its new growths' seals are filled in from the seal script's answers.
    pub next: StreamRouting,
    /// Seals to take, growth by growth.
    pub seals: Vec<SealTodo>,
    /// Records to write (never overwriting one that exists).
    pub records: Vec<Birth>,
    /// Why.
    pub why: Vec<Why>,
}

/// The version after `stored` when a loss may have issued numbers above it: above `floor` (the fences and records
/// Redis kept) and Redis time too, so no number a lost history issued comes back with another meaning.
pub fn retired(stored: RoutingVersion, floor: RoutingVersion, now_ms: u64) -> RoutingVersion {
    // The routing model check's injected bug (tests only): it must find a version naming two layouts.
    #[cfg(test)]
    if super::model::injected(super::model::Bug::RetireFromStored) {
        return stored.next();
    }
    let v = stored.next().max(floor.next()).max(RoutingVersion(now_ms));
    v.min(RoutingVersion(MetadataVersion::MAX_SAFE.0))
}

/// The probe's walk past a missing record at shard `gap`, when shard 0's `fenceCount` says the last layout that
/// sealed it had `sealed_for` shards: the first record to read is that layout's last shard. `None`: no walk.
pub fn first_past_gap(gap: u32, sealed_for: u32) -> Option<u32> {
    (sealed_for > gap.saturating_add(1) && sealed_for <= MAX_SHARDS).then(|| sealed_for - 1)
}

/// The next record of the walk after `found` (the last shard of the growth before the one `found` names), or
/// `None` when that growth starts at or next to the gap (or `found` names no growth). One read per lost growth:
/// [`plan`] restores each growth a record names and one new growth for the shards between.
pub fn next_past_gap(gap: u32, found: &Birth) -> Option<u32> {
    let names_growth = found.count > found.shard.0 && found.parents <= found.shard.0;
    (names_growth && found.parents > gap.saturating_add(1)).then(|| found.parents - 1)
}

/// The restoration `evidence` calls for, or `None` when the stored routing stands.
pub fn plan(stored: &StreamRouting, evidence: &Evidence) -> Option<Plan> {
    let n = stored.shard_count;
    let mut why = Vec::new();
    // Recorded growths beyond the routing, as the records tell them: consecutive runs of one birth version whose
    // parents are where the previous run ended. Anything else (a damaged or foreign record) ends what is believed.
    let mut growths: Vec<(RoutingVersion, u32, u32)> = Vec::new();
    let mut end = n;
    for b in &evidence.beyond {
        if b.shard.0 != end || b.born <= stored.routing_version {
            break;
        }
        let extends = growths
            .last()
            .is_some_and(|&(v, parents, _)| v == b.born && parents == b.parents);
        if extends {
            growths.last_mut().expect("checked above").2 = end + 1;
        } else if b.parents == end && b.born > growths.last().map_or(stored.routing_version, |g| g.0) {
            growths.push((b.born, b.parents, end + 1));
        } else {
            break;
        }
        end += 1;
    }
    // The last run may end at a missing record (the probe stops there: a Cluster master, or the order Redis
    // applied the concurrent record writes in, lost it) before the count its records say the growth had
    // (`bornCount`): the growth is restored whole, and the missing records are written again as it made them.
    let mut gap = Vec::new();
    if let (Some(last), Some(b)) = (
        growths.last_mut(),
        (end - n).checked_sub(1).and_then(|i| evidence.beyond.get(i as usize)),
    ) {
        if b.born == last.0 && b.count > end && b.count <= MAX_SHARDS {
            gap.extend((end..b.count).map(|c| Birth {
                shard: ShardId(c),
                born: last.0,
                parents: last.1,
                count: b.count,
            }));
            last.2 = b.count;
            end = b.count;
        }
    }
    // Past a missing record the probe reads on, up to shard 0's `fenceCount` (the last layout that sealed it), when
    // that is above: a record that names its growth (a count) restores that growth too, its missing records
    // written again, and the shards between what is believed so far and that growth's parents (every record of
    // theirs lost) come back as one new growth, as a report's growth would.
    let mut after_gap: Vec<(Option<RoutingVersion>, u32, u32)> = Vec::new();
    let mut last_born = growths.last().map_or(stored.routing_version, |g| g.0);
    for b in &evidence.beyond {
        if b.shard.0 < end {
            continue;
        }
        let names_growth = b.count > b.shard.0 && b.count <= MAX_SHARDS && b.parents <= b.shard.0;
        if !names_growth || b.born <= last_born || b.parents < end {
            break;
        }
        if b.parents > end {
            after_gap.push((None, end, b.parents));
        }
        after_gap.push((Some(b.born), b.parents, b.count));
        gap.extend((b.parents..b.count).map(|c| Birth {
            shard: ShardId(c),
            born: b.born,
            parents: b.parents,
            count: b.count,
        }));
        end = b.count;
        last_born = b.born;
    }
    if !growths.is_empty() || !after_gap.is_empty() {
        why.push(Why::RecordsBeyond);
    }
    let fence_above = evidence.fence > stored.routing_version;
    if fence_above {
        why.push(Why::FenceAbove);
    }
    // Keys beyond what the records restore that hold entries: a growth only the data knows of (its records lost,
    // or never checked by the plain producers that wrote there). Its children are new, sealed now.
    let data_only = (evidence.entries_end > end).then_some((end, evidence.entries_end));
    if data_only.is_some() {
        why.push(Why::EntriesBeyond);
    }
    // The routing model check's injected bug (tests only): believe a report as the coordinator once did, which the
    // check must find as a growth no Redis evidence supports.
    #[cfg(test)]
    let data_only = match evidence.report.filter(|r| {
        super::model::injected(super::model::Bug::BelieveReports)
            && (evidence.run_id_changed || !stored.reports_settled)
            && r.shard_count <= MAX_SHARDS
            && r.shard_count > data_only.map_or(end, |d| d.1)
    }) {
        Some(r) => {
            why.push(Why::Reported);
            Some((end, r.shard_count))
        }
        None => data_only,
    };
    if why.is_empty() {
        return None;
    }
    let floor = [evidence.fence, last_born].into_iter().max().unwrap_or_default();
    let first = retired(stored.routing_version, floor, evidence.now_ms);
    let mut next = stored.clone();
    let mut seals = Vec::new();
    let mut records = gap;
    let mut version = first;
    let restored = growths
        .iter()
        .map(|&(lost, parents, count)| (Some(lost), parents, count))
        .chain(after_gap)
        .chain(data_only.map(|(parents, count)| (None, parents, count)));
    for (i, (lost, parents, count)) in restored.enumerate() {
        if i > 0 {
            version = version.next();
        }
        next.growths.push(Growth {
            routing_version: version,
            parents,
            shard_count: count,
            seals: Default::default(),
        });
        seals.extend((0..parents).map(|p| SealTodo {
            version,
            shard: ShardId(p),
            reuse: lost,
            count,
        }));
        if lost.is_none() {
            records.extend((parents..count).map(|c| Birth {
                shard: ShardId(c),
                born: version,
                parents,
                count,
            }));
        }
        next.shard_count = count;
    }
    if next.shard_count == n {
        // Nothing to grow: the version alone moves past what was lost, and every shard's fence with it, so a
        // producer holding a lost version refreshes instead of writing with a layout nobody stores.
        seals.extend((0..n).map(|p| SealTodo {
            version,
            shard: ShardId(p),
            reuse: None,
            count: n,
        }));
    } else if let Some(last) = next.growths.last() {
        // The last growth's children too: a section that stopped after its seals may have fenced one of them for
        // a layout it never committed, with more shards (`fenceCount`), which would refuse this layout's
        // producers there for good. Sealed at this version, every shard's fence names this layout.
        let (parents, count) = (last.parents, last.shard_count);
        seals.extend((parents..count).map(|c| SealTodo {
            version,
            shard: ShardId(c),
            reuse: None,
            count,
        }));
    }
    next.routing_version = version;
    let excess = next.growths.len().saturating_sub(MAX_RECORDED_GROWTHS);
    next.growths.drain(..excess);
    next.shard_records = stored.shard_records;
    Some(Plan {
        next,
        seals,
        records,
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::names::StreamName;
    use protocol::RoutingVersion;

    fn stored(version: u64) -> StreamRouting {
        let mut r = StreamRouting::new(StreamName::new("s").unwrap(), 4, 0);
        r.routing_version = RoutingVersion(version);
        r
    }

    fn query(current: u64, max_observed: u64) -> RoutingQuery {
        RoutingQuery {
            routing_version: RoutingVersion(current),
            max_observed_version: RoutingVersion(max_observed),
            max_shard_count: 0,
        }
    }

    /// Seed scenario 5: the producer observed a routing version Redis no longer stores.
    #[test]
    fn a_higher_observed_version_is_answered_sync_metadata_with_the_stored_routing() {
        let r = answer(&stored(3), &query(3, 5));
        assert_eq!(r.status, Status::SyncMetadata);
        assert_eq!(r.routing_version, RoutingVersion(3));
        assert_eq!(r.shard_count, 4);
    }

    #[test]
    fn a_higher_current_version_is_answered_sync_metadata_too() {
        let r = answer(&stored(3), &query(4, 0));
        assert_eq!(r.status, Status::SyncMetadata);
        assert_eq!(r.routing_version, RoutingVersion(3));
    }

    #[test]
    fn an_equal_or_lower_version_is_answered_ok() {
        for (current, max_observed) in [(3, 3), (2, 3), (0, 0), (1, 2)] {
            let r = answer(&stored(3), &query(current, max_observed));
            assert_eq!(r.status, Status::Ok, "{current}/{max_observed}");
            assert_eq!(r.routing_version, RoutingVersion(3));
        }
    }

    const NOW: u64 = 1_800_000_000_000;

    fn evidence() -> Evidence {
        Evidence {
            now_ms: NOW,
            ..Evidence::default()
        }
    }

    fn births(from: u32, to: u32, born: u64, parents: u32) -> Vec<Birth> {
        (from..to)
            .map(|s| Birth {
                shard: ShardId(s),
                born: RoutingVersion(born),
                parents,
                count: to,
            })
            .collect()
    }

    #[test]
    fn nothing_lost_restores_nothing() {
        assert_eq!(plan(&stored(3), &evidence()), None);
        // Records and fences at or below the stored version are the routing's own.
        let e = Evidence {
            fence: RoutingVersion(3),
            entries_end: 4,
            ..evidence()
        };
        assert_eq!(plan(&stored(3), &e), None);
        // A new run id alone: the next write retires the numbers (see `retired`), nothing to restore now.
        let e = Evidence {
            run_id_changed: true,
            ..evidence()
        };
        assert_eq!(plan(&stored(3), &e), None);
    }

    #[test]
    fn a_growth_the_routing_lost_is_restored_as_its_records_tell_it() {
        // 4 -> 8 at version 4 and 8 -> 12 at version 5 were lost from the routing; the shards kept their records.
        let mut beyond = births(4, 8, 4, 4);
        beyond.extend(births(8, 12, 5, 8));
        let e = Evidence {
            beyond,
            fence: RoutingVersion(5),
            ..evidence()
        };
        let p = plan(&stored(3), &e).expect("restored");
        assert_eq!(p.why, vec![Why::RecordsBeyond, Why::FenceAbove]);
        assert_eq!(p.next.shard_count, 12);
        let g: Vec<(u64, u32, u32)> = p
            .next
            .growths
            .iter()
            .map(|g| (g.routing_version.0, g.parents, g.shard_count))
            .collect();
        assert_eq!(
            g,
            vec![(NOW, 4, 8), (NOW + 1, 8, 12)],
            "one growth per lost growth, in order"
        );
        assert_eq!(p.next.routing_version, RoutingVersion(NOW + 1));
        assert!(p.records.is_empty(), "the children have their records");
        // Every parent sealed again, reusing the lost growth's recorded seal, then the last growth's children
        // (their fences name this layout: 12 shards).
        assert_eq!(p.seals.len(), 4 + 8 + 4);
        assert!(p.seals[..4]
            .iter()
            .all(|s| s.version == RoutingVersion(NOW) && s.reuse == Some(RoutingVersion(4)) && s.count == 8));
        assert!(p.seals[4..12]
            .iter()
            .all(|s| s.version == RoutingVersion(NOW + 1) && s.reuse == Some(RoutingVersion(5)) && s.count == 12));
        let children: Vec<u32> = p.seals[12..].iter().map(|s| s.shard.0).collect();
        assert_eq!(children, vec![8, 9, 10, 11]);
        assert!(p.seals[12..]
            .iter()
            .all(|s| s.version == RoutingVersion(NOW + 1) && s.reuse.is_none() && s.count == 12));
    }

    #[test]
    fn a_lost_growth_with_a_missing_record_is_restored_whole() {
        // 4 -> 8 at version 4 was lost from the routing, and so was shard 6's record: the probe stops there, but
        // the records say the growth had 8 shards.
        let e = Evidence {
            beyond: births(4, 6, 4, 4)
                .into_iter()
                .map(|b| Birth { count: 8, ..b })
                .collect(),
            ..evidence()
        };
        let p = plan(&stored(3), &e).expect("restored");
        assert_eq!(p.next.shard_count, 8);
        let written: Vec<(u32, u64, u32, u32)> = p
            .records
            .iter()
            .map(|b| (b.shard.0, b.born.0, b.parents, b.count))
            .collect();
        assert_eq!(
            written,
            vec![(6, 4, 4, 8), (7, 4, 4, 8)],
            "written again as the growth made them"
        );
        // A record without a count (written before counts were) restores only what the records show.
        let e = Evidence {
            beyond: births(4, 6, 4, 4)
                .into_iter()
                .map(|b| Birth { count: 0, ..b })
                .collect(),
            ..evidence()
        };
        assert_eq!(plan(&stored(3), &e).expect("restored").next.shard_count, 6);
    }

    #[test]
    fn records_past_a_gap_that_name_their_growth_restore_it_and_what_came_before() {
        // 4 -> 6 at v4 and 6 -> 8 at v5 were lost; every record of 4 -> 6 was lost too, 6 -> 8 kept shard 7's.
        // The probe read past the gap (shard 0's fenceCount said 8).
        let e = Evidence {
            beyond: vec![Birth {
                shard: ShardId(7),
                born: RoutingVersion(5),
                parents: 6,
                count: 8,
            }],
            fence: RoutingVersion(5),
            ..evidence()
        };
        let p = plan(&stored(3), &e).expect("restored");
        assert_eq!(p.why, vec![Why::RecordsBeyond, Why::FenceAbove]);
        let g: Vec<(u64, u32, u32)> = p
            .next
            .growths
            .iter()
            .map(|g| (g.routing_version.0, g.parents, g.shard_count))
            .collect();
        assert_eq!(
            g,
            vec![(NOW, 4, 6), (NOW + 1, 6, 8)],
            "the unknown growth first, then the recorded one"
        );
        let mut written: Vec<(u32, u64)> = p.records.iter().map(|b| (b.shard.0, b.born.0)).collect();
        written.sort_unstable();
        assert_eq!(
            written,
            vec![(4, NOW), (5, NOW), (6, 5), (7, 5)],
            "new records for the unknown growth; the recorded growth's as it made them (an existing one is kept)"
        );
        // The recorded growth reuses its parents' seals.
        assert!(p
            .seals
            .iter()
            .filter(|s| s.version == RoutingVersion(NOW + 1) && s.shard.0 < 6)
            .all(|s| s.reuse == Some(RoutingVersion(5))));
        // A record past the gap without a count, or born at or below the stored version, is not believed.
        for b in [
            Birth {
                shard: ShardId(7),
                born: RoutingVersion(5),
                parents: 6,
                count: 0,
            },
            Birth {
                shard: ShardId(7),
                born: RoutingVersion(3),
                parents: 6,
                count: 8,
            },
        ] {
            let e = Evidence {
                beyond: vec![b],
                ..evidence()
            };
            assert_eq!(plan(&stored(3), &e), None, "{b:?}");
        }
    }

    #[test]
    fn the_walk_past_a_gap_reads_one_record_per_lost_growth() {
        let b = |shard: u32, parents: u32, count: u32| Birth {
            shard: ShardId(shard),
            born: RoutingVersion(9),
            parents,
            count,
        };
        // Nothing to walk: shard 0's last layout ends at or next to the gap.
        assert_eq!(first_past_gap(4, 4), None);
        assert_eq!(first_past_gap(4, 5), None);
        assert_eq!(first_past_gap(4, MAX_SHARDS + 1), None, "a count no stream can have");
        // Gap at 4, the last layout had 12 shards: read 11, then the last shard before its growth, and so on.
        assert_eq!(first_past_gap(4, 12), Some(11));
        assert_eq!(next_past_gap(4, &b(11, 8, 12)), Some(7));
        assert_eq!(next_past_gap(4, &b(7, 6, 8)), Some(5));
        assert_eq!(next_past_gap(4, &b(5, 5, 6)), None, "the growth starts next to the gap");
        assert_eq!(next_past_gap(4, &b(7, 2, 8)), None, "the growth spans the gap");
        assert_eq!(
            next_past_gap(4, &b(7, 6, 0)),
            None,
            "a record without a count names no growth"
        );
    }

    #[test]
    fn records_that_do_not_follow_the_routing_are_not_believed() {
        // A gap before records that do not name their growth (no count), a record not born of a growth from the
        // stored count, a birth at or below the stored version.
        let uncounted: Vec<Birth> = births(5, 8, 4, 4)
            .into_iter()
            .map(|b| Birth { count: 0, ..b })
            .collect();
        for beyond in [uncounted, births(4, 8, 4, 3), births(4, 8, 2, 4)] {
            let e = Evidence {
                beyond: beyond.clone(),
                ..evidence()
            };
            assert_eq!(plan(&stored(3), &e), None, "{beyond:?}");
        }
        // Believed up to the first record that breaks the chain.
        let mut beyond = births(4, 6, 4, 4);
        beyond.extend(births(6, 8, 9, 3));
        let e = Evidence { beyond, ..evidence() };
        assert_eq!(plan(&stored(3), &e).unwrap().next.shard_count, 6);
    }

    #[test]
    fn a_fence_above_the_routing_moves_the_version_and_every_fence_past_it() {
        let e = Evidence {
            fence: RoutingVersion(7),
            ..evidence()
        };
        let p = plan(&stored(3), &e).unwrap();
        assert_eq!(p.why, vec![Why::FenceAbove]);
        assert_eq!(p.next.shard_count, 4);
        assert_eq!(p.next.routing_version, RoutingVersion(NOW));
        assert!(p.next.growths.is_empty());
        assert_eq!(p.seals.len(), 4, "every shard's fence follows");
    }

    #[test]
    fn a_report_alone_restores_nothing_before_or_after_a_run_id_change() {
        // The forged report of the issue: a producer token asks for 65,536 shards after a clean restart.
        for run_id_changed in [false, true] {
            for report in [
                Report {
                    version: RoutingVersion(4),
                    shard_count: 8,
                },
                Report {
                    version: RoutingVersion(2),
                    shard_count: MAX_SHARDS,
                },
                Report {
                    version: RoutingVersion(u64::MAX),
                    shard_count: u32::MAX,
                },
            ] {
                let e = Evidence {
                    report: Some(report),
                    run_id_changed,
                    ..evidence()
                };
                assert_eq!(
                    plan(&stored(3), &e),
                    None,
                    "{report:?}, run id changed: {run_id_changed}"
                );
            }
        }
    }

    #[test]
    fn shard_keys_beyond_the_routing_that_hold_entries_restore_a_growth() {
        let e = Evidence {
            entries_end: 6,
            run_id_changed: true,
            ..evidence()
        };
        let p = plan(&stored(3), &e).unwrap();
        assert_eq!(p.why, vec![Why::EntriesBeyond]);
        assert_eq!(p.next.shard_count, 6);
        assert_eq!(
            p.next.routing_version,
            RoutingVersion(NOW),
            "retired past what the lost history issued"
        );
        assert_eq!(p.records.len(), 2, "the children get new records");
        assert!(p.seals.iter().all(|s| s.reuse.is_none()));
        assert_eq!(
            p.seals.iter().filter(|s| s.shard.0 < 4).count(),
            4,
            "the parents are sealed"
        );
        // Records restore first; entries beyond them add what the records do not name.
        let e = Evidence {
            beyond: births(4, 5, 4, 4),
            entries_end: 7,
            ..evidence()
        };
        let p = plan(&stored(3), &e).unwrap();
        assert_eq!(p.why, vec![Why::RecordsBeyond, Why::EntriesBeyond]);
        assert_eq!(p.next.shard_count, 7);
        assert_eq!(p.next.growths.len(), 2);
        // Entries only within the routing: nothing to restore.
        let e = Evidence {
            entries_end: 4,
            ..evidence()
        };
        assert_eq!(plan(&stored(3), &e), None);
    }

    #[test]
    fn retired_versions_pass_everything_seen_and_the_clock() {
        assert_eq!(retired(RoutingVersion(3), RoutingVersion(0), 0), RoutingVersion(4));
        assert_eq!(retired(RoutingVersion(3), RoutingVersion(9), 0), RoutingVersion(10));
        assert_eq!(retired(RoutingVersion(3), RoutingVersion(9), NOW), RoutingVersion(NOW));
        assert_eq!(
            retired(RoutingVersion(u64::MAX), RoutingVersion(0), 0),
            RoutingVersion(MetadataVersion::MAX_SAFE.0)
        );
    }

    #[test]
    fn the_refresh_interval_is_a_third_of_the_lease_and_never_zero() {
        let mut r = stored(1);
        r.routing_lease_ms = 30_000;
        assert_eq!(answer(&r, &query(1, 1)).refresh_interval_ms, 10_000);
        assert_eq!(answer(&r, &query(1, 1)).routing_lease_ms, 30_000);
        r.routing_lease_ms = 2;
        assert_eq!(answer(&r, &query(1, 1)).refresh_interval_ms, 1);
    }
}
