//! What the run measured, the checks that decide PASS or FAIL, and the summary table.

use super::board::{shard_list, Fate};
use super::settings::{Settings, PRODUCERS, SHARDS};
use crate::ledger::LedgerCounts;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;
use stream_consumer::ShardId;
use test_support::history::{Report as CheckReport, Violation};

/// How many broken rules the summary lists.
const KEPT_VIOLATIONS: usize = 10;

/// What the run measured.
pub(crate) struct Report {
    pub(crate) settings: Arc<Settings>,
    pub(crate) counts: LedgerCounts,
    /// The history checker's verdict: nothing acknowledged lost, per-key order, one member per shard at a time.
    pub(crate) checks: CheckReport,
    pub(crate) unacknowledged_processed: u64,
    pub(crate) members: Vec<MemberRow>,
    pub(crate) crash: Option<CrashRow>,
    pub(crate) join: Option<JoinRow>,
    pub(crate) publish_secs: f64,
    pub(crate) process_secs: f64,
    pub(crate) total_secs: f64,
    pub(crate) deadline_passed: bool,
    pub(crate) coordinator: String,
    pub(crate) redis: String,
    /// On a cluster: the slot migrations the demo did, one line each (`slot 2319 (shard 4): :p1 -> :p2, ...`).
    pub(crate) slot_migrations: Option<Vec<String>>,
}

pub(crate) struct MemberRow {
    pub(crate) name: String,
    pub(crate) fate: Fate,
    pub(crate) reading_at_end: Vec<ShardId>,
    pub(crate) handled: u64,
    pub(crate) claimed: u64,
    pub(crate) lost: u64,
}

pub(crate) struct CrashRow {
    pub(crate) name: String,
    pub(crate) shards: Vec<ShardId>,
    pub(crate) first_moved: Option<Duration>,
    pub(crate) all_moved: Option<Duration>,
}

pub(crate) struct JoinRow {
    pub(crate) name: String,
    pub(crate) first_shard: Option<(Duration, ShardId)>,
}

impl Report {
    /// Acknowledged records never processed (rule (b)).
    fn missing(&self) -> usize {
        self.count(|v| matches!(v, Violation::MissingPublish { .. }))
    }

    /// First deliveries that came after a later record of their key (rule (c)).
    fn order_violations(&self) -> usize {
        self.count(|v| matches!(v, Violation::KeyOrder { .. }))
    }

    /// Two members handling one shard at overlapping times (rule (a)).
    fn overlaps(&self) -> usize {
        self.count(|v| matches!(v, Violation::Overlap { .. } | Violation::OutsideLease { .. }))
    }

    fn count(&self, f: impl Fn(&Violation) -> bool) -> usize {
        self.checks.violations.iter().filter(|v| f(v)).count()
    }

    pub(crate) fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.missing() > 0 {
            f.push(format!("{} acknowledged record(s) never processed", self.missing()));
        }
        if self.order_violations() > 0 {
            f.push(format!("{} order violation(s)", self.order_violations()));
        }
        if self.overlaps() > 0 {
            f.push(format!("{} shard(s) handled by two members at once", self.overlaps()));
        }
        if self.counts.foreign > 0 {
            f.push(format!(
                "{} entries that are not records of this run",
                self.counts.foreign
            ));
        }
        if self.counts.written == 0 {
            f.push("nothing was published".into());
        }
        if self.crash.as_ref().is_none_or(|c| c.all_moved.is_none()) {
            f.push("the crashed member's shards were not all read elsewhere before the deadline".into());
        }
        if self.join.as_ref().is_none_or(|j| j.first_shard.is_none()) {
            f.push("the new member read no shard before the deadline".into());
        }
        f
    }

    pub(crate) fn print(&self) {
        let mut rows = self.count_rows();
        rows.extend(self.timing_rows());
        let mut t = self.table(&rows);
        self.write_members(&mut t);
        self.write_result(&mut t);
        print!("{t}");
    }

    /// The summary's rows about records: published, processed, and the checks.
    fn count_rows(&self) -> Vec<(String, String, String)> {
        let c = &self.counts;
        let s = &self.settings;
        let mut rows: Vec<(String, String, String)> = Vec::new();
        let mut row = |m: &str, v: String, n: String| rows.push((m.to_owned(), v, n));
        row(
            "records published (acknowledged)",
            c.written.to_string(),
            format!("of {} to publish; {} keys, {PRODUCERS} producers", s.records, s.keys),
        );
        row(
            "publish failures",
            (c.not_written + c.unknown).to_string(),
            format!("{} not written, {} unknown", c.not_written, c.unknown),
        );
        row(
            "records processed",
            c.distinct.to_string(),
            "distinct records the handler ran for".into(),
        );
        row(
            "missing",
            self.missing().to_string(),
            "acknowledged but never processed (must be 0)".into(),
        );
        row(
            "processed, not acknowledged",
            self.unacknowledged_processed.to_string(),
            "publish outcome unknown, yet written".into(),
        );
        row(
            "handler calls",
            c.handlings.to_string(),
            format!("{} with a delivery count >= 2 (claimed)", c.claimed),
        );
        row(
            "redelivered",
            c.redelivered.to_string(),
            "records processed more than once".into(),
        );
        row(
            "out-of-order redeliveries",
            self.checks.reordered_redeliveries.to_string(),
            "key order regressed on a redelivered record (allowed)".into(),
        );
        row(
            "order violations",
            self.order_violations().to_string(),
            "key order regressed outside redeliveries (must be 0)".into(),
        );
        row(
            "shard overlaps",
            self.overlaps().to_string(),
            "two members handling one shard at once (must be 0)".into(),
        );
        rows
    }

    /// The summary's rows about time: the rebalances, the throughput, the slot migrations and the wall time.
    fn timing_rows(&self) -> Vec<(String, String, String)> {
        let c = &self.counts;
        let s = &self.settings;
        let ttl = s.member_ttl().as_secs_f64();
        let mut rows: Vec<(String, String, String)> = Vec::new();
        let mut row = |m: &str, v: String, n: String| rows.push((m.to_owned(), v, n));
        match &self.crash {
            Some(cr) => {
                row(
                    "rebalance: crash -> first shard moved",
                    secs(cr.first_moved),
                    format!("{} aborted while reading {}", cr.name, shard_list(&cr.shards)),
                );
                row(
                    "rebalance: crash -> all shards moved",
                    secs(cr.all_moved),
                    format!("bounded below by the member TTL ({ttl} s)"),
                );
            }
            None => row("rebalance: crash", "not done".into(), String::new()),
        }
        match &self.join {
            Some(j) => row(
                "rebalance: join -> first shard read",
                secs(j.first_shard.map(|(d, _)| d)),
                match j.first_shard {
                    Some((_, shard)) => format!("{} started with shard {shard}", j.name),
                    None => j.name.clone(),
                },
            ),
            None => row("rebalance: join", "not done".into(), String::new()),
        }
        row(
            "throughput: published",
            per_second(c.written, self.publish_secs),
            format!(
                "records/s over {:.2} s (limit {})",
                self.publish_secs,
                if s.rate == 0 {
                    "none".to_owned()
                } else {
                    format!("{}/s", s.rate)
                }
            ),
        );
        row(
            "throughput: processed",
            per_second(c.distinct, self.process_secs),
            format!(
                "records/s over {:.2} s (first publish to last record)",
                self.process_secs
            ),
        );
        if let Some(moves) = &self.slot_migrations {
            row(
                "slot migrations (cluster)",
                moves.len().to_string(),
                if moves.is_empty() {
                    "none".into()
                } else {
                    moves.join("; ")
                },
            );
        }
        row(
            "wall time",
            format!("{:.2} s", self.total_secs),
            "start to summary".into(),
        );

        rows
    }

    /// The heading and the table of `rows`.
    fn table(&self, rows: &[(String, String, String)]) -> String {
        let s = &self.settings;
        let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max("metric".len());
        let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max("value".len());
        let w2 = rows.iter().map(|r| r.2.len()).max().unwrap_or(0).max("note".len());
        let rule = format!("+-{}-+-{}-+-{}-+", "-".repeat(w0), "-".repeat(w1), "-".repeat(w2));
        let mut t = String::new();
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "Summary: stream {} ({SHARDS} shards), group {}; coordinator {}; redis {}",
            s.stream, s.group, self.coordinator, self.redis
        );
        let _ = writeln!(t, "{rule}");
        let _ = writeln!(t, "| {:<w0$} | {:>w1$} | {:<w2$} |", "metric", "value", "note");
        let _ = writeln!(t, "{rule}");
        for (m, v, n) in rows {
            let _ = writeln!(t, "| {m:<w0$} | {v:>w1$} | {n:<w2$} |");
        }
        let _ = writeln!(t, "{rule}");
        let _ = writeln!(t);
        t
    }

    /// Every member's fate and counts, and what the columns mean.
    fn write_members(&self, t: &mut String) {
        let _ = writeln!(
            *t,
            "{:<12} {:<9} {:>10} {:>9} {:>6}  shards at the end",
            "member", "fate", "handled", "claimed", "lost"
        );
        for m in &self.members {
            let fate = match m.fate {
                Fate::Running => "running",
                Fate::Crashed => "crashed",
                Fate::Closed => "closed",
            };
            let _ = writeln!(
                *t,
                "{:<12} {:<9} {:>10} {:>9} {:>6}  {}",
                m.name,
                fate,
                m.handled,
                m.claimed,
                m.lost,
                shard_list(&m.reading_at_end)
            );
        }
        let _ = writeln!(
            *t,
            "claimed: entries a crashed member had read but not handled, taken over by the next owner (delivery count \
             >= 2); redelivered: records processed twice (usually 0: even a crash acknowledges what was handled)"
        );
    }

    /// The violations kept, the deadline, and the result line.
    fn write_result(&self, t: &mut String) {
        let s = &self.settings;
        for v in self.checks.violations.iter().take(KEPT_VIOLATIONS) {
            let _ = writeln!(*t, "violation: {v}");
        }
        if self.deadline_passed {
            let _ = writeln!(
                *t,
                "the deadline ({} s after publishing) passed before everything was processed",
                s.deadline.as_secs()
            );
        }
        let failures = self.failures();
        if failures.is_empty() {
            let _ = writeln!(*t, "RESULT: PASS");
        } else {
            let _ = writeln!(*t, "RESULT: FAIL: {}", failures.join("; "));
        }
    }
}

/// A duration for the summary, in seconds.
fn secs(d: Option<Duration>) -> String {
    d.map_or("not observed".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
}

/// `n` per second over `secs`, or `-` for no time.
fn per_second(n: u64, secs: f64) -> String {
    if secs > 0.0 {
        format!("{:.0}", n as f64 / secs)
    } else {
        "-".into()
    }
}
