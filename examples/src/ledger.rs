//! The demo's bookkeeping: what was published, what was handled, and the checks of the summary.
//!
//! # Records
//! The demo publishes `records` records over `keys` keys. Record `i` has key `i % keys` and per-key sequence
//! number `i / keys`; its fields are `key` (`key-<k>`) and `seq` (`<s>`). All records of one key are published by
//! one producer, in increasing sequence order, so the order in which a key's records are written to their shard
//! stream is their sequence order.
//!
//! # Definitions
//! * **published**: records whose publish was acknowledged (`Producer::send_batch` reported them written).
//! * **processed**: records the handler was called for at least once (a handling counts once the handler ran).
//! * **missing**: published records never processed. Must be 0.
//! * **redelivered**: records processed more than once (at-least-once delivery: a member crashed after
//!   handling an entry and before its `XACK` reached Redis, so the next owner claimed it again).
//! * **out of order**: a handling of record `(k, s)` is out of order when a record of key `k` with a sequence
//!   number above `s` was handled earlier, by any member, in the order the handler calls happened in this
//!   process. This includes the same member, so "a key's sequence numbers are non-decreasing per member" is
//!   part of the check; it is stricter than that, because it also catches a new owner of a shard going back
//!   behind what the previous owner already handled.
//! * **excused**: an out-of-order handling is excused only when it is a redelivery: the record had already been
//!   handled before (this is its second or later handling) *and* Redis reports it delivered more than once
//!   (delivery count >= 2: it was claimed from a pending-entries list, which is what happens to the entries of a
//!   crashed member). The crash is the only source of such redeliveries in the demo.
//! * **order violation**: every out-of-order handling that is not excused. Must be 0.

use std::time::Instant;

/// What a publish reported for one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PublishState {
    /// Not sent yet.
    #[default]
    Pending,
    /// Acknowledged: in its shard stream.
    Written,
    /// Known not written.
    NotWritten,
    /// The connection dropped mid-pipeline: may or may not be written.
    Unknown,
}

/// How one handling was classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// First handling, in order.
    InOrder,
    /// A repeat of a record handled before, in order.
    Redelivered,
    /// Out of order, excused (a redelivery).
    Excused,
    /// Out of order and not a redelivery: a violation.
    Violation,
    /// Not a record of this run (unparseable fields, or out of range).
    Foreign,
}

/// One order violation, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Member index.
    pub member: usize,
    /// Key index.
    pub key: u64,
    /// The sequence number handled.
    pub seq: u64,
    /// The highest sequence number of the key handled before (by any member).
    pub seen: u64,
    /// Redis's delivery count.
    pub delivery_count: u32,
}

/// Per-member counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberCounts {
    /// Handler calls.
    pub handled: u64,
    /// Handler calls with a delivery count >= 2.
    pub claimed: u64,
}

/// The bookkeeping of one run.
#[derive(Debug)]
pub struct Ledger {
    keys: u64,
    published: Vec<PublishState>,
    handled: Vec<u32>,
    /// Highest sequence number handled per key, by any member (`None`: none yet).
    key_max: Vec<Option<u64>>,
    members: Vec<MemberCounts>,
    distinct: u64,
    handlings: u64,
    claimed: u64,
    redelivered_records: u64,
    excused: u64,
    violations: u64,
    first_violations: Vec<Violation>,
    foreign: u64,
    written: u64,
    not_written: u64,
    unknown: u64,
    last_new_at: Option<Instant>,
}

/// How many violations are kept for the report.
const KEPT_VIOLATIONS: usize = 10;

impl Ledger {
    /// A ledger for `records` records over `keys` keys (`keys >= 1`).
    pub fn new(records: u64, keys: u64) -> Ledger {
        let n = usize::try_from(records).expect("record count fits in memory");
        let k = usize::try_from(keys.max(1)).expect("key count fits in memory");
        Ledger {
            keys: keys.max(1),
            published: vec![PublishState::Pending; n],
            handled: vec![0; n],
            key_max: vec![None; k],
            members: Vec::new(),
            distinct: 0,
            handlings: 0,
            claimed: 0,
            redelivered_records: 0,
            excused: 0,
            violations: 0,
            first_violations: Vec::new(),
            foreign: 0,
            written: 0,
            not_written: 0,
            unknown: 0,
            last_new_at: None,
        }
    }

    /// Key index of record `i`.
    pub fn key_of(&self, i: u64) -> u64 {
        i % self.keys
    }

    /// Sequence number of record `i`.
    pub fn seq_of(&self, i: u64) -> u64 {
        i / self.keys
    }

    /// The field value naming key `k`.
    pub fn key_name(k: u64) -> String {
        format!("key-{k}")
    }

    /// Records the publish outcome of record `i`.
    pub fn published(&mut self, i: u64, state: PublishState) {
        let Some(slot) = usize::try_from(i).ok().and_then(|i| self.published.get_mut(i)) else {
            return;
        };
        match state {
            PublishState::Written => self.written += 1,
            PublishState::NotWritten => self.not_written += 1,
            PublishState::Unknown => self.unknown += 1,
            PublishState::Pending => {}
        }
        *slot = state;
    }

    /// Records one handler call by `member` of the entry with fields `key` / `seq` and Redis delivery count
    /// `delivery_count`.
    pub fn handle(&mut self, member: usize, key: Option<&str>, seq: Option<&str>, delivery_count: u32) -> Handling {
        let parsed = key
            .and_then(|k| k.strip_prefix("key-"))
            .and_then(|k| k.parse::<u64>().ok())
            .zip(seq.and_then(|s| s.parse::<u64>().ok()));
        let Some((k, s)) = parsed.filter(|&(k, _)| k < self.keys) else {
            self.foreign += 1;
            return Handling::Foreign;
        };
        let Some(i) = s
            .checked_mul(self.keys)
            .and_then(|x| x.checked_add(k))
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < self.handled.len())
        else {
            self.foreign += 1;
            return Handling::Foreign;
        };
        if self.members.len() <= member {
            self.members.resize(member + 1, MemberCounts::default());
        }
        let k = k as usize;
        let counts = &mut self.members[member];
        counts.handled += 1;
        self.handlings += 1;
        if delivery_count >= 2 {
            counts.claimed += 1;
            self.claimed += 1;
        }
        let before = self.handled[i];
        self.handled[i] = before.saturating_add(1);
        if before == 0 {
            self.distinct += 1;
            self.last_new_at = Some(Instant::now());
        } else if before == 1 {
            self.redelivered_records += 1;
        }
        let seen = self.key_max[k];
        let out_of_order = seen.is_some_and(|seen| seen > s);
        self.key_max[k] = seen.max(Some(s));
        let redelivery = before > 0 && delivery_count >= 2;
        match (out_of_order, redelivery) {
            (false, _) if before == 0 => Handling::InOrder,
            (false, _) => Handling::Redelivered,
            (true, true) => {
                self.excused += 1;
                Handling::Excused
            }
            (true, false) => {
                self.violations += 1;
                if self.first_violations.len() < KEPT_VIOLATIONS {
                    self.first_violations.push(Violation {
                        member,
                        key: k as u64,
                        seq: s,
                        seen: seen.unwrap_or(0),
                        delivery_count,
                    });
                }
                Handling::Violation
            }
        }
    }

    /// Published (acknowledged) records not processed yet.
    pub fn missing(&self) -> u64 {
        self.published
            .iter()
            .zip(&self.handled)
            .filter(|(p, h)| **p == PublishState::Written && **h == 0)
            .count() as u64
    }

    /// Records processed whose publish was not acknowledged (unknown outcome, or not recorded yet).
    pub fn processed_unacknowledged(&self) -> u64 {
        self.published
            .iter()
            .zip(&self.handled)
            .filter(|(p, h)| **p != PublishState::Written && **h > 0)
            .count() as u64
    }

    /// A copy of the counters.
    pub fn counts(&self) -> LedgerCounts {
        LedgerCounts {
            written: self.written,
            not_written: self.not_written,
            unknown: self.unknown,
            distinct: self.distinct,
            handlings: self.handlings,
            claimed: self.claimed,
            redelivered: self.redelivered_records,
            excused: self.excused,
            violations: self.violations,
            foreign: self.foreign,
            last_new_at: self.last_new_at,
        }
    }

    /// Counters of member `m`.
    pub fn member(&self, m: usize) -> MemberCounts {
        self.members.get(m).copied().unwrap_or_default()
    }

    /// The first order violations (at most ten).
    pub fn first_violations(&self) -> &[Violation] {
        &self.first_violations
    }
}

/// The ledger's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerCounts {
    /// Acknowledged publishes.
    pub written: u64,
    /// Publishes known not written.
    pub not_written: u64,
    /// Publishes with an unknown outcome.
    pub unknown: u64,
    /// Records processed at least once.
    pub distinct: u64,
    /// Handler calls.
    pub handlings: u64,
    /// Handler calls with a delivery count >= 2.
    pub claimed: u64,
    /// Records processed more than once.
    pub redelivered: u64,
    /// Out-of-order handlings excused as redeliveries.
    pub excused: u64,
    /// Order violations.
    pub violations: u64,
    /// Entries that are not records of this run.
    pub foreign: u64,
    /// When the last record was processed for the first time.
    pub last_new_at: Option<Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handles record `i` of a 2-key ledger.
    fn handle(l: &mut Ledger, member: usize, i: u64, deliveries: u32) -> Handling {
        let (k, s) = (l.key_of(i), l.seq_of(i));
        l.handle(member, Some(&Ledger::key_name(k)), Some(&s.to_string()), deliveries)
    }

    #[test]
    fn records_map_to_keys_and_sequences() {
        let l = Ledger::new(10, 3);
        assert_eq!((l.key_of(7), l.seq_of(7)), (1, 2));
    }

    #[test]
    fn in_order_handling_and_missing() {
        let mut l = Ledger::new(6, 2);
        for i in 0..6 {
            l.published(i, PublishState::Written);
        }
        for i in 0..5 {
            assert_eq!(handle(&mut l, 0, i, 1), Handling::InOrder);
        }
        assert_eq!(l.missing(), 1);
        assert_eq!(handle(&mut l, 1, 5, 1), Handling::InOrder);
        assert_eq!(l.missing(), 0);
        let c = l.counts();
        assert_eq!((c.distinct, c.handlings, c.redelivered, c.violations), (6, 6, 0, 0));
    }

    #[test]
    fn a_crash_redelivery_may_regress() {
        // Member 0 handles seq 0, 1, 2 of key 0 (records 0, 2, 4) and crashes before acking seq 1 and 2.
        let mut l = Ledger::new(8, 2);
        for i in [0, 2, 4] {
            handle(&mut l, 0, i, 1);
        }
        // Member 1 claims them again, then goes on.
        assert_eq!(handle(&mut l, 1, 2, 2), Handling::Excused);
        assert_eq!(handle(&mut l, 1, 4, 2), Handling::Redelivered);
        assert_eq!(handle(&mut l, 1, 6, 1), Handling::InOrder);
        let c = l.counts();
        assert_eq!((c.redelivered, c.excused, c.violations, c.claimed), (2, 1, 0, 2));
    }

    #[test]
    fn a_first_handling_that_regresses_is_a_violation() {
        let mut l = Ledger::new(8, 2);
        handle(&mut l, 0, 4, 1);
        // Record 2 (key 0, seq 1) was never handled: claimed or not, it came after seq 2.
        assert_eq!(handle(&mut l, 1, 2, 2), Handling::Violation);
        assert_eq!(l.counts().violations, 1);
        assert_eq!(
            l.first_violations()[0],
            Violation {
                member: 1,
                key: 0,
                seq: 1,
                seen: 2,
                delivery_count: 2
            }
        );
    }

    #[test]
    fn a_repeat_redis_calls_a_first_delivery_is_a_violation() {
        // Handled before, but Redis says first delivery: not a claim from a pending list.
        let mut l = Ledger::new(8, 2);
        handle(&mut l, 0, 2, 1);
        handle(&mut l, 0, 4, 1);
        assert_eq!(handle(&mut l, 0, 2, 1), Handling::Violation);
    }

    #[test]
    fn per_member_regression_is_checked() {
        let mut l = Ledger::new(8, 2);
        handle(&mut l, 0, 6, 1);
        assert_eq!(handle(&mut l, 0, 4, 1), Handling::Violation);
    }

    #[test]
    fn foreign_entries_are_counted() {
        let mut l = Ledger::new(4, 2);
        assert_eq!(l.handle(0, Some("other"), Some("1"), 1), Handling::Foreign);
        assert_eq!(l.handle(0, Some("key-1"), None, 1), Handling::Foreign);
        assert_eq!(l.handle(0, Some("key-5"), Some("0"), 1), Handling::Foreign);
        assert_eq!(l.handle(0, Some("key-1"), Some("9"), 1), Handling::Foreign);
        assert_eq!(l.counts().foreign, 4);
    }

    #[test]
    fn unacknowledged_but_processed() {
        let mut l = Ledger::new(4, 2);
        l.published(0, PublishState::Written);
        l.published(1, PublishState::Unknown);
        handle(&mut l, 0, 0, 1);
        handle(&mut l, 0, 1, 1);
        assert_eq!(l.processed_unacknowledged(), 1);
        assert_eq!(l.missing(), 0);
        assert_eq!(l.counts().unknown, 1);
    }
}
