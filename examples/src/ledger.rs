//! The demo's bookkeeping: what was published and what was handled, counted for the progress and the summary.
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
//! * **redelivered**: records processed more than once (at-least-once delivery: a member crashed after
//!   handling an entry and before its `XACK` reached Redis, so the next owner claimed it again).
//! * **claimed**: handlings with a delivery count >= 2 (taken from a pending-entries list, which is what
//!   happens to the entries of a crashed member).
//!
//! The checks of the summary (nothing acknowledged lost, per-key order, one member per shard at a time) are not
//! made here: the demo records every handling and acknowledged publish into the one history checker,
//! `test_support::history::History`, and its report decides PASS or FAIL. The ledger is the bookkeeping the
//! progress bars and the table show, and what the demo waits on (cheap to read while the run goes on).

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
    /// First handling of the record.
    First,
    /// A repeat of a record handled before.
    Redelivered,
    /// Not a record of this run (unparseable fields, or out of range).
    Foreign,
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
    members: Vec<MemberCounts>,
    distinct: u64,
    handlings: u64,
    claimed: u64,
    redelivered_records: u64,
    foreign: u64,
    written: u64,
    not_written: u64,
    unknown: u64,
    last_new_at: Option<Instant>,
}

impl Ledger {
    /// A ledger for `records` records over `keys` keys (`keys >= 1`).
    pub fn new(records: u64, keys: u64) -> Ledger {
        let n = usize::try_from(records).expect("record count fits in memory");
        Ledger {
            keys: keys.max(1),
            published: vec![PublishState::Pending; n],
            handled: vec![0; n],
            members: Vec::new(),
            distinct: 0,
            handlings: 0,
            claimed: 0,
            redelivered_records: 0,
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
        if before == 0 {
            Handling::First
        } else {
            Handling::Redelivered
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
            foreign: self.foreign,
            last_new_at: self.last_new_at,
        }
    }

    /// Counters of member `m`.
    pub fn member(&self, m: usize) -> MemberCounts {
        self.members.get(m).copied().unwrap_or_default()
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
    fn first_handlings_and_missing() {
        let mut l = Ledger::new(6, 2);
        for i in 0..6 {
            l.published(i, PublishState::Written);
        }
        for i in 0..5 {
            assert_eq!(handle(&mut l, 0, i, 1), Handling::First);
        }
        assert_eq!(l.missing(), 1);
        assert_eq!(handle(&mut l, 1, 5, 1), Handling::First);
        assert_eq!(l.missing(), 0);
        let c = l.counts();
        assert_eq!((c.distinct, c.handlings, c.redelivered), (6, 6, 0));
    }

    #[test]
    fn a_crash_redelivery_is_counted_per_record_and_member() {
        // Member 0 handles seq 0, 1, 2 of key 0 (records 0, 2, 4) and crashes before acking seq 1 and 2.
        let mut l = Ledger::new(8, 2);
        for i in [0, 2, 4] {
            handle(&mut l, 0, i, 1);
        }
        // Member 1 claims them again, then goes on.
        assert_eq!(handle(&mut l, 1, 2, 2), Handling::Redelivered);
        assert_eq!(handle(&mut l, 1, 4, 2), Handling::Redelivered);
        assert_eq!(handle(&mut l, 1, 6, 1), Handling::First);
        let c = l.counts();
        assert_eq!((c.redelivered, c.claimed, c.distinct), (2, 2, 4));
        assert_eq!(l.member(1), MemberCounts { handled: 3, claimed: 2 });
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
