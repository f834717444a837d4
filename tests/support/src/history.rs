//! The history checker: a [`History`] of everything the applications saw, and the rules it must obey. The one
//! checker of the repository: the scenario tests, the consumer's integration tests and the chaos soak record
//! into it.
//!
//! Tests record two things while they run:
//! * every handler invocation, with [`History::begin`] at the start of the handler and
//!   [`Handling::succeeded`] when it returns `Ok` (the guard records the end when dropped, also when the consumer
//!   drops the handler's future): shard, member, entry id, key, delivery count, monotonic and wall-clock start and
//!   end, and the member's assignment-lease end as the consumer knew it at the start;
//! * every acknowledged publish ([`History::published`]): the producer answered `Written` with this entry id.
//!
//! [`History::check`] then applies three rules:
//!
//! | Rule | Violation | What it means |
//! |---|---|---|
//! | (a) one member per shard at a time | [`Violation::Overlap`] | Per shard, invocations form consecutive stints of one member; a stint must end (its last handler returned or was dropped) before the next member's stint starts. |
//! | (a) within the lease | [`Violation::OutsideLease`] | A handler started after the lease its member knew had ended (beyond [`LEASE_SLACK`]). |
//! | (b) nothing acknowledged is lost | [`Violation::MissingPublish`] | An acknowledged publish has no successful handler invocation. |
//! | (c) per-key order | [`Violation::KeyOrder`] | For one key on one shard, a first delivery of an entry came after a later entry of that key was handled. |
//!
//! Documented exceptions to (c): a *redelivery* (delivery count above 1, or an entry handled before) may come
//! after later entries: at-least-once delivery re-hands an entry whose handler failed, was dropped, or whose ack
//! was lost. Order is only checked among entries of one key *in one shard*: when shards are added, a key may move
//! to a new shard and order across the move is not preserved (docs/failure-handling.md, "Shards added").
//!
//! The key of an invocation is the message's `key` field when it has one ([`KEY_FIELD`]), else the key of the
//! acknowledged publish with the same shard and entry id.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use stream_consumer::{EntryId, Message};
use stream_producer::Published;

/// The field scenario producers write the record's key into (the producer routes by key but does not store it).
pub const KEY_FIELD: &str = "key";

/// Tolerance of the lease rule: the consumer publishes a new lease end in its status right after it starts the
/// readers that lease allows, so a handler may start a few microseconds before the recorder can see the new end.
pub const LEASE_SLACK: Duration = Duration::from_millis(20);

/// One handler invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The member whose handler ran.
    pub member: String,
    /// The shard the entry was read from.
    pub shard: u32,
    /// The entry.
    pub entry: EntryId,
    /// The record's key, when the message carries one.
    pub key: Option<String>,
    /// Delivery count of this delivery (1 on the first).
    pub delivery: u32,
    /// Monotonic start.
    pub started: Instant,
    /// Monotonic end: the handler returned, or its future was dropped.
    pub ended: Instant,
    /// Wall-clock start, for reports.
    pub started_wall: SystemTime,
    /// The member's assignment-lease end as its consumer knew it when the handler started (`None`: unknown).
    pub lease_until: Option<Instant>,
    /// Whether the handler returned `Ok` (the entry was then acknowledged).
    pub ok: bool,
}

/// One acknowledged publish: the producer answered `Written`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// The record's key (`None`: routed round-robin).
    pub key: Option<String>,
    /// The shard written to.
    pub shard: u32,
    /// The entry id Redis assigned.
    pub entry: EntryId,
    /// The routing version the shard was chosen with.
    pub routing_version: u64,
    /// When the answer arrived.
    pub acked_at: Instant,
}

/// A broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Rule (a): two members handled one shard at overlapping times.
    Overlap {
        /// The shard.
        shard: u32,
        /// The member whose stint came first.
        first: String,
        /// When its last invocation of that stint ended.
        first_until: Instant,
        /// The member whose stint came next.
        second: String,
        /// When that stint started.
        second_from: Instant,
    },
    /// Rule (a): a handler started after its member's lease ended.
    OutsideLease {
        /// The member.
        member: String,
        /// The shard.
        shard: u32,
        /// The entry.
        entry: EntryId,
        /// How long after the lease end it started.
        late_by: Duration,
    },
    /// Rule (b): an acknowledged publish was never handled successfully.
    MissingPublish {
        /// The shard.
        shard: u32,
        /// The entry.
        entry: EntryId,
        /// Its key.
        key: Option<String>,
    },
    /// Rule (c): a first delivery of `entry` came after the later `after` of the same key and shard.
    KeyOrder {
        /// The key.
        key: String,
        /// The shard.
        shard: u32,
        /// The entry handled out of order.
        entry: EntryId,
        /// The later entry that had already been handled.
        after: EntryId,
        /// The member that handled `entry`.
        member: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap {
                shard,
                first,
                first_until,
                second,
                second_from,
            } => write!(
                f,
                "(a) shard {shard}: {first} handled it until {:?} after {second} had started",
                first_until.saturating_duration_since(*second_from)
            ),
            Violation::OutsideLease {
                member,
                shard,
                entry,
                late_by,
            } => write!(
                f,
                "(a) {member} started entry {entry} of shard {shard} {late_by:?} after its lease ended"
            ),
            Violation::MissingPublish { shard, entry, key } => {
                write!(
                    f,
                    "(b) acknowledged publish {entry} (key {key:?}) of shard {shard} was never handled"
                )
            }
            Violation::KeyOrder {
                key,
                shard,
                entry,
                after,
                member,
            } => write!(
                f,
                "(c) key {key:?} on shard {shard}: {member} handled {entry} for the first time after {after}"
            ),
        }
    }
}

/// What [`History::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Every broken rule, grouped by rule.
    pub violations: Vec<Violation>,
    /// Handler invocations checked.
    pub invocations: usize,
    /// Acknowledged publishes checked.
    pub publishes: usize,
    /// Redeliveries that came after a later entry of their key: the documented exception to rule (c), counted
    /// for reports.
    pub reordered_redeliveries: usize,
}

impl Report {
    /// Whether every rule holds.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} violation(s) in {} invocations and {} acknowledged publishes",
            self.violations.len(),
            self.invocations,
            self.publishes
        )?;
        for v in self.violations.iter().take(20) {
            writeln!(f, "  {v}")?;
        }
        if self.violations.len() > 20 {
            writeln!(f, "  ...")?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Inner {
    handled: Vec<Handled>,
    /// Invocations still running, by guard id.
    open: BTreeMap<u64, Handled>,
    next_id: u64,
    published: Vec<Publish>,
}

/// Everything applications saw during a scenario. Cheap to clone; clones share the record.
#[derive(Debug, Clone, Default)]
pub struct History {
    inner: Arc<Mutex<Inner>>,
}

/// A running handler invocation; records its end when dropped. Call [`Handling::succeeded`] when the handler
/// returns `Ok`.
#[derive(Debug)]
pub struct Handling {
    history: History,
    id: u64,
    ok: bool,
}

impl Handling {
    /// The handler returned `Ok`.
    pub fn succeeded(mut self) {
        self.ok = true;
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        let mut inner = self.history.lock();
        if let Some(mut h) = inner.open.remove(&self.id) {
            h.ended = Instant::now();
            h.ok = self.ok;
            inner.handled.push(h);
        }
    }
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panicking scenario must still be able to print its history.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the start of `member`'s handler for `message`, with the lease end its consumer knows now.
    pub fn begin(&self, member: &str, message: &Message, lease_until: Option<Instant>) -> Handling {
        let h = Handled {
            member: member.to_owned(),
            shard: message.shard().0,
            entry: message.id(),
            key: message.get_str(KEY_FIELD).map(str::to_owned),
            delivery: message.delivery_count(),
            started: Instant::now(),
            ended: Instant::now(),
            started_wall: SystemTime::now(),
            lease_until,
            ok: false,
        };
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.open.insert(id, h);
        Handling {
            history: self.clone(),
            id,
            ok: false,
        }
    }

    /// Records a finished invocation as given (hand-made histories, replays).
    pub fn record_handled(&self, handled: Handled) {
        self.lock().handled.push(handled);
    }

    /// Records an acknowledged publish of `key`.
    pub fn published(&self, key: Option<&str>, published: &Published) {
        self.record_publish(Publish {
            key: key.map(str::to_owned),
            shard: published.shard.0,
            entry: published.id,
            routing_version: published.routing_version.0,
            acked_at: Instant::now(),
        });
    }

    /// Records an acknowledged publish as given.
    pub fn record_publish(&self, publish: Publish) {
        self.lock().published.push(publish);
    }

    /// Every invocation, finished or running (a running one ends "now"), in start order.
    pub fn handled(&self) -> Vec<Handled> {
        let inner = self.lock();
        let now = Instant::now();
        let mut all = inner.handled.clone();
        all.extend(inner.open.values().cloned().map(|mut h| {
            h.ended = now;
            h
        }));
        all.sort_by_key(|h| h.started);
        all
    }

    /// Every acknowledged publish, in acknowledgement order.
    pub fn publishes(&self) -> Vec<Publish> {
        let mut all = self.lock().published.clone();
        all.sort_by_key(|p| p.acked_at);
        all
    }

    /// Entries (shard, id) handled successfully at least once.
    pub fn acked(&self) -> BTreeSet<(u32, EntryId)> {
        self.handled()
            .iter()
            .filter(|h| h.ok)
            .map(|h| (h.shard, h.entry))
            .collect()
    }

    /// Whether every acknowledged publish has been handled successfully.
    pub fn all_published_handled(&self) -> bool {
        let acked = self.acked();
        self.publishes().iter().all(|p| acked.contains(&(p.shard, p.entry)))
    }

    /// Invocations by `member` that started after `t`.
    pub fn of_member_since(&self, member: &str, t: Instant) -> Vec<Handled> {
        self.handled()
            .into_iter()
            .filter(|h| h.member == member && h.started > t)
            .collect()
    }

    /// The longest time between two consecutive handler starts (any member) within `[from, to]`, counting the
    /// edges of the window: how long "nobody read anything" lasted.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let mut points: Vec<Instant> = self
            .handled()
            .iter()
            .map(|h| h.started)
            .filter(|t| *t >= from && *t <= to)
            .collect();
        points.insert(0, from);
        points.push(to);
        points
            .windows(2)
            .map(|w| w[1].saturating_duration_since(w[0]))
            .max()
            .unwrap_or_default()
    }

    /// Applies every rule.
    pub fn check(&self) -> Report {
        let handled = self.handled();
        let publishes = self.publishes();
        let mut violations = overlaps(&handled);
        violations.extend(outside_lease(&handled));
        violations.extend(missing(&handled, &publishes));
        let (reordered, reordered_redeliveries) = key_order(&handled, &publishes);
        violations.extend(reordered);
        Report {
            violations,
            invocations: handled.len(),
            publishes: publishes.len(),
            reordered_redeliveries,
        }
    }

    /// Panics with the report unless every rule holds.
    ///
    /// # Panics
    /// When a rule is broken.
    pub fn assert_holds(&self) {
        let report = self.check();
        assert!(report.is_ok(), "invariants broken: {report}");
    }

    /// Panics unless rule (a) holds (no overlap, nothing outside a lease); for scenarios whose publishes Redis may
    /// legitimately lose (a failover with data loss).
    ///
    /// # Panics
    /// When rule (a) is broken.
    pub fn assert_no_overlap(&self) {
        let handled = self.handled();
        let mut violations = overlaps(&handled);
        violations.extend(outside_lease(&handled));
        let report = Report {
            violations,
            invocations: handled.len(),
            publishes: 0,
            reordered_redeliveries: 0,
        };
        assert!(report.is_ok(), "invariants broken: {report}");
    }
}

/// Rule (a), stints: per shard, consecutive invocations of one member form a stint; the next member's stint must
/// start after the previous stint's last end.
fn overlaps(handled: &[Handled]) -> Vec<Violation> {
    let mut by_shard: BTreeMap<u32, Vec<&Handled>> = BTreeMap::new();
    for h in handled {
        by_shard.entry(h.shard).or_default().push(h);
    }
    let mut out = Vec::new();
    for (shard, mut list) in by_shard {
        list.sort_by_key(|h| h.started);
        // (member, first start, last end)
        let mut stints: Vec<(&str, Instant, Instant)> = Vec::new();
        for h in list {
            match stints.last_mut() {
                Some((m, _, end)) if *m == h.member => *end = (*end).max(h.ended),
                _ => stints.push((&h.member, h.started, h.ended)),
            }
        }
        for pair in stints.windows(2) {
            let ((first, _, until), (second, from, _)) = (pair[0], pair[1]);
            if until > from {
                out.push(Violation::Overlap {
                    shard,
                    first: first.to_owned(),
                    first_until: until,
                    second: second.to_owned(),
                    second_from: from,
                });
            }
        }
    }
    out
}

/// Rule (a), leases: no handler starts after its member's known lease end.
fn outside_lease(handled: &[Handled]) -> Vec<Violation> {
    handled
        .iter()
        .filter_map(|h| {
            let lease = h.lease_until?;
            (h.started > lease + LEASE_SLACK).then(|| Violation::OutsideLease {
                member: h.member.clone(),
                shard: h.shard,
                entry: h.entry,
                late_by: h.started - lease,
            })
        })
        .collect()
}

/// Rule (b).
fn missing(handled: &[Handled], publishes: &[Publish]) -> Vec<Violation> {
    let acked: BTreeSet<(u32, EntryId)> = handled.iter().filter(|h| h.ok).map(|h| (h.shard, h.entry)).collect();
    publishes
        .iter()
        .filter(|p| !acked.contains(&(p.shard, p.entry)))
        .map(|p| Violation::MissingPublish {
            shard: p.shard,
            entry: p.entry,
            key: p.key.clone(),
        })
        .collect()
}

/// Rule (c), and how many redeliveries it excused.
fn key_order(handled: &[Handled], publishes: &[Publish]) -> (Vec<Violation>, usize) {
    let key_of_publish: BTreeMap<(u32, EntryId), &str> = publishes
        .iter()
        .filter_map(|p| Some(((p.shard, p.entry), p.key.as_deref()?)))
        .collect();
    // (key, shard) -> (highest entry handled so far, entries handled so far)
    let mut seen: BTreeMap<(String, u32), (EntryId, BTreeSet<EntryId>)> = BTreeMap::new();
    let mut out = Vec::new();
    let mut excused = 0;
    let mut sorted: Vec<&Handled> = handled.iter().collect();
    sorted.sort_by_key(|h| h.started);
    for h in sorted {
        let Some(key) = h
            .key
            .as_deref()
            .or_else(|| key_of_publish.get(&(h.shard, h.entry)).copied())
        else {
            continue;
        };
        let (highest, entries) = seen
            .entry((key.to_owned(), h.shard))
            .or_insert_with(|| (h.entry, BTreeSet::new()));
        let redelivery = h.delivery > 1 || entries.contains(&h.entry);
        if h.entry < *highest && redelivery {
            excused += 1;
        } else if h.entry < *highest {
            out.push(Violation::KeyOrder {
                key: key.to_owned(),
                shard: h.shard,
                entry: h.entry,
                after: *highest,
                member: h.member.clone(),
            });
        }
        *highest = (*highest).max(h.entry);
        entries.insert(h.entry);
    }
    (out, excused)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A hand-made history on a fixed origin.
    struct Make {
        t0: Instant,
        history: History,
    }

    impl Make {
        fn new() -> Make {
            Make {
                t0: Instant::now(),
                history: History::new(),
            }
        }

        fn at(&self, ms: u64) -> Instant {
            self.t0 + MS * ms as u32
        }

        /// `member` handles entry `seq` of `shard` (key `key`) from `start` to `end` ms, lease until `lease` ms.
        #[allow(clippy::too_many_arguments)]
        fn handle(
            &self,
            member: &str,
            shard: u32,
            seq: u64,
            key: &str,
            delivery: u32,
            (start, end): (u64, u64),
            lease: u64,
            ok: bool,
        ) {
            self.history.record_handled(Handled {
                member: member.into(),
                shard,
                entry: EntryId { ms: 1000, seq },
                key: Some(key.into()),
                delivery,
                started: self.at(start),
                ended: self.at(end),
                started_wall: SystemTime::now(),
                lease_until: Some(self.at(lease)),
                ok,
            });
        }

        fn publish(&self, shard: u32, seq: u64, key: &str) {
            self.history.record_publish(Publish {
                key: Some(key.into()),
                shard,
                entry: EntryId { ms: 1000, seq },
                routing_version: 1,
                acked_at: self.at(seq),
            });
        }
    }

    /// a reads shard 0 until its drain, b takes over afterwards; every publish handled in order.
    fn clean() -> Make {
        let m = Make::new();
        for seq in 1..=4 {
            m.publish(0, seq, "k");
        }
        m.handle("a", 0, 1, "k", 1, (10, 20), 1000, true);
        m.handle("a", 0, 2, "k", 1, (20, 30), 1000, true);
        m.handle("b", 0, 3, "k", 1, (40, 50), 1000, true);
        m.handle("b", 0, 4, "k", 1, (50, 60), 1000, true);
        m
    }

    #[test]
    fn a_clean_handover_satisfies_every_rule() {
        let report = clean().history.check();
        assert!(report.is_ok(), "{report}");
        assert_eq!((report.invocations, report.publishes), (4, 4));
    }

    #[test]
    fn two_members_on_one_shard_at_once_break_rule_a() {
        let m = clean();
        // a's handler of entry 5 was still running when b started.
        m.handle("a", 0, 5, "other", 1, (35, 45), 1000, true);
        let report = m.history.check();
        assert!(
            matches!(report.violations.as_slice(), [Violation::Overlap { shard: 0, first, second, .. }] if first == "a" && second == "b"),
            "{report}"
        );
    }

    #[test]
    fn a_member_reading_inside_anothers_stint_breaks_rule_a() {
        let m = Make::new();
        m.handle("a", 0, 1, "k", 1, (0, 100), 1000, true);
        m.handle("b", 0, 2, "k", 1, (50, 60), 1000, true);
        m.handle("a", 0, 3, "k", 1, (110, 120), 1000, true);
        let report = m.history.check();
        assert!(
            report.violations.iter().any(|v| matches!(v, Violation::Overlap { .. })),
            "{report}"
        );
    }

    #[test]
    fn handling_after_the_lease_ended_breaks_rule_a() {
        let m = clean();
        m.handle("b", 1, 9, "x", 1, (500, 510), 400, true);
        let report = m.history.check();
        assert!(
            matches!(report.violations.as_slice(), [Violation::OutsideLease { member, shard: 1, .. }] if member == "b"),
            "{report}"
        );
    }

    #[test]
    fn an_acknowledged_publish_never_handled_breaks_rule_b() {
        let m = clean();
        m.publish(0, 7, "k");
        // A failed attempt does not count.
        m.handle("b", 0, 7, "k", 1, (70, 80), 1000, false);
        let report = m.history.check();
        assert!(
            matches!(report.violations.as_slice(), [Violation::MissingPublish { shard: 0, entry, .. }] if entry.seq == 7),
            "{report}"
        );
    }

    #[test]
    fn a_first_delivery_after_a_later_entry_of_its_key_breaks_rule_c() {
        let m = Make::new();
        m.publish(0, 1, "k");
        m.publish(0, 2, "k");
        m.handle("a", 0, 2, "k", 1, (10, 20), 1000, true);
        m.handle("a", 0, 1, "k", 1, (20, 30), 1000, true);
        let report = m.history.check();
        assert!(
            matches!(report.violations.as_slice(), [Violation::KeyOrder { key, entry, after, .. }] if key == "k" && entry.seq == 1 && after.seq == 2),
            "{report}"
        );
    }

    #[test]
    fn redeliveries_and_keys_moved_to_another_shard_are_documented_exceptions_to_rule_c() {
        let m = Make::new();
        for seq in 1..=3 {
            m.publish(0, seq, "k");
        }
        m.handle("a", 0, 1, "k", 1, (10, 20), 1000, true);
        m.handle("a", 0, 2, "k", 1, (20, 30), 1000, true);
        m.handle("a", 0, 3, "k", 1, (30, 40), 1000, true);
        // The ack of 1 was lost: the next owner re-delivers it after 3.
        m.handle("b", 0, 1, "k", 2, (50, 60), 1000, true);
        // The same entry handled twice by one member (a failed attempt, then a retry) is no reordering either.
        m.handle("b", 0, 3, "k", 1, (60, 70), 1000, true);
        // After shards were added, the key lives on shard 5 with lower entry ids than before: a new sequence.
        m.publish(5, 0, "k");
        m.handle("b", 5, 0, "k", 1, (80, 90), 1000, true);
        let report = m.history.check();
        assert!(report.is_ok(), "{report}");
        // The redelivery of 1 after 3 went back in key order: counted, not refused.
        assert_eq!(report.reordered_redeliveries, 1, "{report}");
    }

    #[test]
    fn the_key_of_an_invocation_falls_back_to_its_publish() {
        let m = Make::new();
        m.publish(0, 1, "k");
        m.publish(0, 2, "k");
        for (seq, start) in [(2, 10), (1, 20)] {
            m.history.record_handled(Handled {
                member: "a".into(),
                shard: 0,
                entry: EntryId { ms: 1000, seq },
                key: None,
                delivery: 1,
                started: m.at(start),
                ended: m.at(start + 5),
                started_wall: SystemTime::now(),
                lease_until: None,
                ok: true,
            });
        }
        let report = m.history.check();
        assert!(
            matches!(report.violations.as_slice(), [Violation::KeyOrder { .. }]),
            "{report}"
        );
    }

    #[test]
    fn guards_record_the_end_and_the_outcome() {
        let history = History::new();
        let message = Message::new(
            stream_consumer::StreamName::new("s").unwrap(),
            stream_consumer::ShardId(3),
            EntryId { ms: 5, seq: 1 },
            vec![(KEY_FIELD.as_bytes().to_vec(), b"k1".to_vec())],
            1,
        );
        history.begin("a", &message, None).succeeded();
        drop(history.begin("a", &message, None));
        let handled = history.handled();
        assert_eq!(handled.len(), 2);
        assert_eq!(handled[0].key.as_deref(), Some("k1"));
        assert_eq!(handled.iter().filter(|h| h.ok).count(), 1);
        assert_eq!(history.acked().len(), 1);
    }

    #[test]
    fn longest_gap_counts_the_window_edges() {
        let m = Make::new();
        m.handle("a", 0, 1, "k", 1, (100, 110), 1000, true);
        m.handle("a", 0, 2, "k", 1, (150, 160), 1000, true);
        assert_eq!(m.history.longest_gap(m.at(0), m.at(400)), MS * 250);
    }
}
