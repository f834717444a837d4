//! The last rebalance events this coordinator instance decided, for the status page.
//!
//! Kept in memory only, bounded, and per instance: it is a view for operators, not a record. What a group *is*
//! always comes from Redis; this answers "what moved lately?" without a log search. Another instance's decisions
//! (several coordinators share a group) and anything before this process started are not here.

use std::collections::VecDeque;
use std::sync::Mutex;

use protocol::names::{GroupName, StreamName};

use crate::state_machine::Event;

/// How many events are kept: enough for the last few rebalances of a busy deployment, small enough to render.
pub const RECENT_CAPACITY: usize = 100;

/// One rebalance event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentEvent {
    /// Wall-clock time this instance recorded it, in ms since the Unix epoch (for display only).
    pub at_unix_ms: u64,
    /// The stream of the group.
    pub stream: StreamName,
    /// The group.
    pub group: GroupName,
    /// What happened, e.g. `MemberJoined(worker-1)`.
    pub what: String,
}

/// A bounded ring of [`RecentEvent`]s, newest last.
#[derive(Debug, Default)]
pub struct RecentRebalances {
    events: Mutex<VecDeque<RecentEvent>>,
}

impl RecentRebalances {
    /// Records `event` if it is part of a rebalance (membership, ownership, correction rounds); others are dropped.
    pub fn record(&self, stream: &StreamName, group: &GroupName, event: &Event) {
        let what = match event {
            Event::MemberJoined(m) => format!("member {m} joined"),
            Event::MemberLeft(m) => format!("member {m} left"),
            Event::MemberExpired(m) => format!("member {m} expired"),
            Event::MemberFenced { member, reason } => format!("member {member} fenced ({reason})"),
            Event::ShardReleased { shard, from } => format!("shard {} released by {from}", shard.0),
            Event::ShardGranted { shard, to } => format!("shard {} granted to {to}", shard.0),
            Event::CorrectionOpened { reported, stored } => {
                format!("correction round opened (reported {reported}, stored {stored})")
            }
            Event::CorrectionClosed => "correction round closed".to_owned(),
            _ => return,
        };
        let at_unix_ms = crate::clock::unix_ms();
        let mut events = self.events.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if events.len() == RECENT_CAPACITY {
            events.pop_front();
        }
        events.push_back(RecentEvent {
            at_unix_ms,
            stream: stream.clone(),
            group: group.clone(),
            what,
        });
    }

    /// The recorded events, newest first.
    pub fn newest_first(&self) -> Vec<RecentEvent> {
        let events = self.events.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        events.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::names::MemberId;
    use protocol::ShardId;

    fn names() -> (StreamName, GroupName) {
        (
            StreamName::new("orders").expect("name"),
            GroupName::new("billing").expect("name"),
        )
    }

    #[test]
    fn keeps_rebalance_events_newest_first_and_bounded() {
        let (s, g) = names();
        let recent = RecentRebalances::default();
        let a = MemberId::new("a").expect("name");
        recent.record(&s, &g, &Event::MemberJoined(a.clone()));
        recent.record(&s, &g, &Event::CorrectionClosed);
        recent.record(
            &s,
            &g,
            &Event::ShardGranted {
                shard: ShardId(3),
                to: a,
            },
        );
        let seen: Vec<String> = recent.newest_first().into_iter().map(|e| e.what).collect();
        assert_eq!(
            seen,
            ["shard 3 granted to a", "correction round closed", "member a joined"]
        );
        for _ in 0..RECENT_CAPACITY + 5 {
            recent.record(&s, &g, &Event::CorrectionClosed);
        }
        assert_eq!(recent.newest_first().len(), RECENT_CAPACITY);
    }

    #[test]
    fn other_events_are_not_rebalances() {
        let (s, g) = names();
        let recent = RecentRebalances::default();
        recent.record(
            &s,
            &g,
            &Event::ForeignClaim {
                shard: ShardId(1),
                member: MemberId::new("a").expect("name"),
            },
        );
        assert!(recent.newest_first().is_empty());
    }
}
