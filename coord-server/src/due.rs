//! Visiting what is due: the tick loop visits only the groups whose next deadline has come, and a slow sweep
//! visits every group once per [`SWEEP_PERIOD`] whatever the index says.
//!
//! # The due index
//! A sorted set in Redis (`protocol::keys::due_index`), shared by every coordinator replica: member = the group's
//! groups index member, score = the Redis time (ms) of its next deadline ([`crate::state_machine::due`]), `+inf`
//! for none, `0` for "at once". Each tick reads the members due by Redis `TIME` (one script), visits them, and
//! writes their new scores in one `ZADD`.
//!
//! Who writes a score, and why the index never holds one later than the truth for long:
//! * every group section that changed the aggregate writes the score of what it committed (a join, a leave, an
//!   ack or a fence may bring a deadline forward); a heartbeat that only renewed leases writes nothing: a renewal
//!   only moves a deadline later, and an earlier score left behind costs one early visit that finds nothing to do
//!   and writes the later score;
//! * every tick visit writes the score of the state it left (plain `ZADD`, not `ZADD LT`: after a visit the
//!   deadline usually moves later);
//! * a routing commit makes every group of the stream due at once (adopting a routing is not a deadline);
//! * group creation makes the group due at once.
//!
//! A score and the commit it describes are two commands (the index has no hash tag, the group's keys do), so
//! two writers can cross: a visitor computes a later score from revision `r`, a join commits `r+1` and writes an
//! earlier score, then the visitor's `ZADD` lands last. So every writer reads the group's revision again after
//! its `ZADD`: a revision other than the one its score describes means another commit may have been overwritten,
//! and the group is made due at once (the next visit scores what is stored). The other writer's own check comes
//! after its own `ZADD`, so whichever lands last is checked against every commit before it.
//!
//! Besides its deadlines, a group with members is due every half member TTL ([`observe_by`]): the tick visit is
//! also what refreshes the group's gauges (heartbeat age, drains). A group without members is visited only by the
//! sweep, which is the point: idle groups cost nothing per tick.
//!
//! Several replicas visiting one due group is harmless: the visits are critical sections on the group's mutex
//! with the revision compare-and-set, the second finds nothing left to do, and both write the same score (up to
//! their expiry graces: a replica that just started writes its grace's end, a later score; that delays an expiry
//! by at most one member TTL, the grace's own bound).
//!
//! # The safety sweep
//! The index may be lost or wrong (a Redis restart or failover losing recent writes, a failed `ZADD` after a
//! commit, eviction despite the `noeviction` precondition, an operator's `DEL`). Each tick also visits a slice of
//! the groups index (and of the groups this process found within the slot retention), sized so that the whole
//! list is visited once per [`SWEEP_PERIOD`] (`--due-sweep-period-ms`); a visit writes the group's score, so a
//! group missing from the index gets its entry back. That bounds how late a member expires with the index lost:
//! one sweep period after its deadline, plus a tick. 60 s is six default member TTLs: a lost index (a rare
//! event) delays expiry by about a minute, while the sweep's steady cost is one visit per group per minute, not
//! one per tick (four a second).
//!
//! The sweep never depends on the due index: a tick that cannot read it (of the wrong type, a failed read) still
//! runs its slice, and the sweep's list comes from the groups index or, when that is of the wrong type, from a
//! `SCAN` of the metadata keys. So the bound holds whatever state the index is in; the coordinator also rebuilds
//! an index of the wrong type (see `Coordinator::sweep_groups` and `Coordinator::repair_due_index`, and
//! `docs/failure-handling.md`, "Damaged coordinator keys").
//!
//! A sweep visit reads its stream's routing (to adopt it) but does not tend it (read its shard records, see
//! `Coordinator::tend_routing`), except with a data Redis of its own: otherwise Redis loses records only with a
//! restart, failover or restore, which changes the run id the tick checks, and every routing is tended for a
//! member TTL after that. So a sweep visit costs four Redis commands (the routing read, `LOAD`, `RELEASE` and the
//! score's revision check) and a share of the tick's `ZADD`, whatever the stream's shard count.

use protocol::messages::GroupRef;
use std::time::Duration;
use tokio::time::Instant;

/// Default of [`crate::Config::due_sweep_period`]: see the module docs for the choice. At most 120 s, the age at
/// which an unrefreshed per-group gauge disappears.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(60);

/// When a group must be visited next to keep its per-group gauges (heartbeat age, drains, correction age) fresh:
/// half a member TTL from `now_ms` while it has members (a silent member's heartbeat age is seen growing before
/// its expiry), or after a commit that changed the aggregate (`changed`: a visit shows the change, a leave's
/// too). `None` otherwise: the gauges of a group without members do not change with time, and the sweep
/// refreshes them well within the 120 s after which an unrefreshed gauge disappears.
pub fn observe_by(meta: &protocol::metadata::GroupMetadata, now_ms: u64, changed: bool) -> Option<u64> {
    (changed || !meta.members.is_empty()).then(|| now_ms.saturating_add(meta.timings.member_ttl_ms / 2))
}

/// Why the tick loop visits a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Its score in the due index has come.
    Due,
    /// The safety sweep's turn.
    Sweep,
}

/// The safety sweep's progress through one round over the groups.
#[derive(Debug, Default)]
pub(crate) struct Sweep {
    groups: Vec<GroupRef>,
    next: usize,
    started: Option<Instant>,
    /// When the due index was last found of the wrong type and a repair tried: a repair Redis refuses (an ACL
    /// without `TYPE` or `DEL`) is not retried on every tick.
    due_repair: crate::clock::LastRun,
}

impl Sweep {
    /// Whether a new round should begin: the last one is through and its period is over (or none ran yet).
    pub fn round_due(&self, period: Duration) -> bool {
        self.next >= self.groups.len() && self.started.is_none_or(|s| s.elapsed() >= period)
    }

    /// Whether a repair of the due index may be tried now (at most one per `period`); records the try.
    pub fn repair_due(&mut self, period: Duration) -> bool {
        let due = self.due_repair.due(period);
        if due {
            self.due_repair.mark();
        }
        due
    }

    /// Begins a round over `groups`.
    pub fn start(&mut self, groups: Vec<GroupRef>) {
        self.groups = groups;
        self.next = 0;
        self.started = Some(Instant::now());
    }

    /// The groups to visit now: as many as bring the round to the share of its period that has passed, so a
    /// round is spread over the period (and catches up after slow ticks) rather than visiting everything at once.
    pub fn take(&mut self, period: Duration) -> Vec<GroupRef> {
        let Some(started) = self.started else { return Vec::new() };
        let n = self.groups.len();
        let elapsed = started.elapsed();
        let share = if elapsed >= period {
            n
        } else {
            let part = (n as u128 * elapsed.as_nanos()).div_ceil(period.as_nanos().max(1));
            part as usize
        };
        let end = share.clamp(self.next, n);
        let out = self.groups[self.next..end].to_vec();
        self.next = end;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::names::{GroupName, StreamName};

    fn groups(n: usize) -> Vec<GroupRef> {
        (0..n)
            .map(|i| GroupRef {
                stream: StreamName::new("s").expect("name"),
                group: GroupName::new(format!("g{i}")).expect("name"),
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_is_spread_over_its_period_and_the_next_waits_for_it() {
        let period = Duration::from_secs(60);
        let mut sweep = Sweep::default();
        assert!(sweep.round_due(period), "no round ran yet");
        sweep.start(groups(600));
        assert!(sweep.take(period).is_empty(), "nothing of the period has passed");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(sweep.take(period).len(), 10);
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(sweep.take(period).len(), 290, "a late tick catches up");
        assert!(!sweep.round_due(period));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(sweep.take(period).len(), 300);
        assert!(sweep.take(period).is_empty());
        assert!(sweep.round_due(period));
    }
}
