//! The board: what every member reads, and the two rebalances being timed.

use super::output::Output;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use stream_consumer::{ConsumerStatus, RebalanceListener, ShardId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    Running,
    Crashed,
    Closed,
}

#[derive(Debug)]
pub(crate) struct MemberView {
    pub(crate) name: String,
    pub(crate) fate: Fate,
    pub(crate) reading: Vec<ShardId>,
    pub(crate) pending: Vec<ShardId>,
    pub(crate) lost: u64,
}

#[derive(Debug)]
pub(crate) struct CrashWatch {
    pub(crate) member: usize,
    pub(crate) at: Instant,
    pub(crate) shards: Vec<ShardId>,
    pub(crate) first_moved: Option<Instant>,
    pub(crate) all_moved: Option<Instant>,
}

#[derive(Debug)]
pub(crate) struct JoinWatch {
    pub(crate) member: usize,
    pub(crate) at: Instant,
    pub(crate) first_shard: Option<(Instant, ShardId)>,
}

#[derive(Debug, Default)]
pub(crate) struct Board {
    pub(crate) members: BTreeMap<usize, MemberView>,
    pub(crate) crash: Option<CrashWatch>,
    pub(crate) join: Option<JoinWatch>,
}

pub(crate) fn shard_list(shards: &[ShardId]) -> String {
    let list: Vec<String> = shards.iter().map(ToString::to_string).collect();
    format!("[{}]", list.join(" "))
}

impl Board {
    /// Applies a member's new status; returns the events to print.
    pub(crate) fn update(&mut self, member: usize, status: &ConsumerStatus) -> Vec<String> {
        let mut events = Vec::new();
        let Some(view) = self.members.get_mut(&member) else {
            return events;
        };
        if view.fate != Fate::Running {
            return events;
        }
        view.pending = status.pending.clone();
        if view.reading != status.reading {
            view.reading = status.reading.clone();
            events.push(format!(
                "{} reads {} shard(s) {}",
                view.name,
                view.reading.len(),
                shard_list(&view.reading)
            ));
        }
        events.extend(self.check());
        events
    }

    /// Whether a running member other than `except` reads `shard`.
    pub(crate) fn read_elsewhere(&self, shard: ShardId, except: usize) -> bool {
        self.members
            .iter()
            .any(|(&m, v)| m != except && v.fate == Fate::Running && v.reading.contains(&shard))
    }

    /// Times the rebalances that completed.
    pub(crate) fn check(&mut self) -> Vec<String> {
        let mut events = Vec::new();
        let now = Instant::now();
        if let Some(c) = &self.crash {
            if c.all_moved.is_none() {
                let moved = c.shards.iter().filter(|&&s| self.read_elsewhere(s, c.member)).count();
                let (member, at, total) = (c.member, c.at, c.shards.len());
                let name = self.members[&member].name.clone();
                let c = self.crash.as_mut().expect("checked above");
                if moved > 0 && c.first_moved.is_none() {
                    c.first_moved = Some(now);
                }
                if moved == total {
                    c.all_moved = Some(now);
                    events.push(format!(
                        "REBALANCED: all {total} shard(s) of crashed {name} are read by other members, {:.2} s after \
                         the crash",
                        (now - at).as_secs_f64()
                    ));
                }
            }
        }
        if let Some(j) = &mut self.join {
            if j.first_shard.is_none() {
                let view = &self.members[&j.member];
                if let Some(&shard) = view.reading.first() {
                    j.first_shard = Some((now, shard));
                    events.push(format!(
                        "JOINED: {} reads its first shard ({shard}), {:.2} s after joining",
                        view.name,
                        (now - j.at).as_secs_f64()
                    ));
                }
            }
        }
        events
    }

    /// One line: shards per member.
    pub(crate) fn line(&self) -> String {
        let parts: Vec<String> = self
            .members
            .values()
            .map(|v| match v.fate {
                Fate::Running if v.pending.is_empty() => {
                    format!("{}: {} {}", v.name, v.reading.len(), shard_list(&v.reading))
                }
                Fate::Running => format!(
                    // Assigned here, but the previous owner has not released them yet.
                    "{}: {} {} (+{} awaiting handover)",
                    v.name,
                    v.reading.len(),
                    shard_list(&v.reading),
                    v.pending.len()
                ),
                Fate::Crashed => format!("{}: CRASHED", v.name),
                Fate::Closed => format!("{}: closed", v.name),
            })
            .collect();
        parts.join(" | ")
    }

    pub(crate) fn rebalanced(&self) -> bool {
        self.crash.as_ref().is_some_and(|c| c.all_moved.is_some())
            && self.join.as_ref().is_some_and(|j| j.first_shard.is_some())
    }
}

/// Reports shards lost without a drain (should not happen in the demo: only the crashed member loses shards,
/// and it is gone).
pub(crate) struct LostListener {
    pub(crate) member: usize,
    pub(crate) board: Arc<Mutex<Board>>,
    pub(crate) out: Arc<Output>,
}

impl RebalanceListener for LostListener {
    async fn on_lost(&self, shards: Vec<ShardId>) {
        let name = {
            let mut board = self.board.lock().expect("board lock");
            let Some(view) = board.members.get_mut(&self.member) else {
                return;
            };
            view.lost += shards.len() as u64;
            view.name.clone()
        };
        self.out.event(format!(
            "{name} LOST shards {} (fenced, forgotten or lease expired)",
            shard_list(&shards)
        ));
    }
}
