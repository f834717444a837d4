//! What this process keeps per group between critical sections: the local lock, the heartbeat queue (group
//! commit) and the memory of the last aggregate read or written.
//!
//! A slot exists while a request or tick uses it, and afterwards only for a group some load found (see
//! [`SLOT_RETENTION`]): requests naming groups that do not exist leave nothing here and add no tick work.

use protocol::messages::{GroupRef, HeartbeatRequest, HeartbeatResponse};
use protocol::metadata::GroupMetadata;
use protocol::names::{GroupName, StreamName};
use protocol::{MetadataVersion, StoreRevision};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::sync::oneshot;

use crate::clock::LastRun;
use crate::error::Error;
use crate::store::group_fields::StoredFields;

/// How long a slot is kept after the last load that found its group: a group that stays deleted (and unindexed)
/// is ticked that long, with this process's memory of its versions, then forgotten.
pub const SLOT_RETENTION: Duration = Duration::from_secs(300);

/// One group's slot.
#[derive(Default)]
pub(crate) struct GroupSlot {
    /// The "local monitor": one critical section per group at a time in this process.
    pub lock: tokio::sync::Mutex<()>,
    /// Heartbeats waiting for the next critical section of the group (group commit).
    pub queue: StdMutex<Vec<Queued>>,
    pub cache: StdMutex<GroupMemory>,
    /// When a load last found the group's metadata hash; `None`: never (the group may not exist).
    present_at: StdMutex<LastRun>,
    /// When the slot was last taken for use, on [`Slots`]'s use counter: the least recently used cached
    /// aggregates are dropped first ([`Slots::trim_aggregates`]).
    used: AtomicU64,
}

impl GroupSlot {
    fn present_at(&self) -> LastRun {
        *self.present_at.lock().expect("slot lock")
    }

    pub fn mark_present(&self) {
        self.present_at.lock().expect("slot lock").mark();
    }

    /// Whether this slot is worth keeping when nobody uses it: its group was found recently.
    fn retained(&self) -> bool {
        !self.present_at().due(SLOT_RETENTION)
    }

    /// What this process remembers of the group now.
    pub fn memory(&self) -> GroupMemory {
        self.cache.lock().expect("cache lock").clone()
    }

    /// Forgets the cached aggregate (it is not the stored one any more); what this process saw (highest version,
    /// grace) stays.
    pub fn drop_aggregate(&self) {
        let mut memory = self.cache.lock().expect("cache lock");
        memory.aggregate = None;
        memory.fields = None;
    }
}

/// Most heartbeats run in one critical section: bounds the section's time and the COMMIT script's size.
const MAX_HEARTBEAT_BATCH: usize = 256;

impl GroupSlot {
    /// Queues `req` and waits for its answer. Heartbeats of one group that arrive while a critical section runs
    /// wait in the group's queue; whoever takes the local lock next passes all of them (up to a bound) to `run`,
    /// which runs them as one section (one LOAD, one COMMIT) and answers each: a large group costs two round
    /// trips per batch rather than per member.
    pub async fn group_commit<R, Fut>(
        &self,
        req: &HeartbeatRequest,
        max_members: Option<u32>,
        mut run: R,
    ) -> Result<HeartbeatResponse, Error>
    where
        R: FnMut(Vec<Queued>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (reply, mut answer) = oneshot::channel();
        self.queue.lock().expect("queue lock").push(Queued {
            req: req.clone(),
            max_members,
            reply,
        });
        loop {
            let local = self.lock.lock().await;
            match answer.try_recv() {
                Ok(result) => return result,
                Err(oneshot::error::TryRecvError::Closed) => {
                    // The section that took our request was cancelled before answering. A heartbeat is
                    // idempotent: queue it again.
                    let (reply, again) = oneshot::channel();
                    self.queue.lock().expect("queue lock").push(Queued {
                        req: req.clone(),
                        max_members,
                        reply,
                    });
                    answer = again;
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let batch: Vec<Queued> = {
                let mut queue = self.queue.lock().expect("queue lock");
                let n = queue.len().min(MAX_HEARTBEAT_BATCH);
                queue.drain(..n).collect()
            };
            if !batch.is_empty() {
                run(batch).await;
            }
            drop(local);
            if let Ok(result) = answer.try_recv() {
                return result;
            }
        }
    }
}

/// A heartbeat waiting in a group's queue, with the channel its answer goes back on.
pub(crate) struct Queued {
    pub req: HeartbeatRequest,
    /// The member quota of the token that sent it (`None`: no limit).
    pub max_members: Option<u32>,
    pub reply: oneshot::Sender<Result<HeartbeatResponse, Error>>,
}

impl Queued {
    /// The request as the core takes it.
    pub fn admission(&self) -> crate::state_machine::Admission<'_> {
        crate::state_machine::Admission {
            req: &self.req,
            max_members: self.max_members,
        }
    }
}

/// What this process remembers about a group between critical sections.
#[derive(Clone, Default)]
pub(crate) struct GroupMemory {
    /// The decoded aggregate at a revision: a load at the same revision skips fetching and parsing it.
    pub aggregate: Option<(StoreRevision, Arc<GroupMetadata>)>,
    /// The stamps and digests of that aggregate's stored fields (at the same revision): a load reads only the
    /// fields changed since, and a commit names the digest of every field it replaces.
    pub fields: Option<Arc<StoredFields>>,
    /// [`StoredFields::xor`] of `fields`, as the load script compares it (16 hex digits).
    pub digest: String,
    /// When a load last compared every stored field with `fields` (the digest check of ticks, or a full read).
    pub verified_at: Option<std::time::Instant>,
    /// Highest metadata version this process has seen for the group (to notice a regression itself).
    pub highest: MetadataVersion,
    /// No expiry before this Redis time: first sight of the group by this process, or a seen regression.
    /// `None` until the first load.
    pub grace_until_ms: Option<u64>,
}

/// Every slot of this process.
#[derive(Default)]
pub(crate) struct Slots {
    groups: StdMutex<HashMap<(StreamName, GroupName), Arc<GroupSlot>>>,
    /// Counts uses of slots, to order them by last use.
    uses: AtomicU64,
}

impl Slots {
    /// The slot of a group, created when missing.
    pub fn slot(&self, stream: &StreamName, group: &GroupName) -> Arc<GroupSlot> {
        let mut groups = self.groups.lock().expect("groups lock");
        let slot = groups.entry((stream.clone(), group.clone())).or_default().clone();
        slot.used
            .store(self.uses.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        slot
    }

    /// Keeps at most `max` cached aggregates, dropping those of the least recently used slots. Returns how many
    /// were dropped. Dropping is always safe: the next section of the group reads the aggregate from Redis again
    /// (what this process saw of the group, its highest version and grace, stays).
    pub fn trim_aggregates(&self, max: usize) -> usize {
        let groups = self.groups.lock().expect("groups lock");
        let mut cached: Vec<(u64, &Arc<GroupSlot>)> = groups
            .values()
            .filter(|s| s.cache.lock().expect("cache lock").aggregate.is_some())
            .map(|s| (s.used.load(Ordering::Relaxed), s))
            .collect();
        let excess = cached.len().saturating_sub(max);
        if excess == 0 {
            return 0;
        }
        cached.select_nth_unstable_by_key(excess - 1, |(used, _)| *used);
        for (_, slot) in &cached[..excess] {
            slot.drop_aggregate();
        }
        excess
    }

    /// How many slots hold a cached aggregate.
    pub fn cached_aggregates(&self) -> usize {
        let groups = self.groups.lock().expect("groups lock");
        groups
            .values()
            .filter(|s| s.cache.lock().expect("cache lock").aggregate.is_some())
            .count()
    }

    /// Drops `slot` and, when its group was never found and nobody else uses the slot, forgets it: a request
    /// naming a group that does not exist leaves no state behind.
    pub fn forget_if_absent(&self, stream: &StreamName, group: &GroupName, slot: Arc<GroupSlot>) {
        if slot.present_at().ever() {
            return;
        }
        let key = (stream.clone(), group.clone());
        let mut groups = self.groups.lock().expect("groups lock");
        // New users clone the slot only under this lock: two references (the map's and ours) mean no other user.
        let unused = groups
            .get(&key)
            .is_some_and(|s| Arc::ptr_eq(s, &slot) && Arc::strong_count(&slot) == 2);
        if unused && slot.queue.lock().expect("queue lock").is_empty() {
            groups.remove(&key);
        }
    }

    /// Forgets every slot nobody uses whose group no load found within [`SLOT_RETENTION`]. Returns how many
    /// slots remain.
    pub fn evict_idle(&self) -> usize {
        let mut groups = self.groups.lock().expect("groups lock");
        groups.retain(|_, slot| {
            Arc::strong_count(slot) > 1 || !slot.queue.lock().expect("queue lock").is_empty() || slot.retained()
        });
        groups.len()
    }

    /// Whether a load of this process found the group (any group of the stream, for `None`) within
    /// [`SLOT_RETENTION`]: a trace Redis cannot lose, though only this process has it.
    pub fn seen_recently(&self, stream: &StreamName, group: Option<&GroupName>) -> bool {
        let groups = self.groups.lock().expect("groups lock");
        groups
            .iter()
            .any(|((s, g), slot)| s == stream && group.is_none_or(|group| g == group) && slot.retained())
    }

    /// The groups a load found within [`SLOT_RETENTION`].
    pub fn retained(&self) -> Vec<GroupRef> {
        let slots = self.groups.lock().expect("groups lock");
        slots
            .iter()
            .filter(|(_, slot)| slot.retained())
            .map(|((stream, group), _)| GroupRef {
                stream: stream.clone(),
                group: group.clone(),
            })
            .collect()
    }

    /// The longest member TTL of the groups whose aggregate this process holds.
    pub fn max_ttl_ms(&self) -> Option<u64> {
        let groups = self.groups.lock().expect("groups lock");
        groups
            .values()
            .filter_map(|s| {
                s.cache
                    .lock()
                    .expect("cache lock")
                    .aggregate
                    .as_ref()
                    .map(|(_, meta)| meta.timings.member_ttl_ms)
            })
            .max()
    }

    /// How many slots there are.
    pub fn len(&self) -> usize {
        self.groups.lock().expect("groups lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_found_group_is_kept_for_the_retention_then_forgotten_when_idle() {
        let slots = Slots::default();
        let (stream, group) = (StreamName::new("s").expect("name"), GroupName::new("g").expect("name"));
        let slot = slots.slot(&stream, &group);
        slot.mark_present();
        drop(slot);
        tokio::time::advance(SLOT_RETENTION - Duration::from_millis(1)).await;
        assert_eq!(slots.evict_idle(), 1, "found within the retention: kept");
        assert!(slots.seen_recently(&stream, Some(&group)));
        assert_eq!(slots.retained().len(), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!slots.seen_recently(&stream, None));
        assert!(slots.retained().is_empty());
        assert_eq!(slots.evict_idle(), 0, "idle and not found for the retention: forgotten");
    }

    #[test]
    fn the_least_recently_used_aggregates_are_dropped_beyond_the_budget() {
        let slots = Slots::default();
        let stream = StreamName::new("s").expect("name");
        let meta = |g: &GroupName| {
            let timings = protocol::metadata::GroupTimings::default();
            let m = GroupMetadata::new(stream.clone(), g.clone(), 1, protocol::RoutingVersion(1), timings, 0);
            Some((StoreRevision(1), Arc::new(m)))
        };
        let names: Vec<GroupName> = (0..5).map(|i| GroupName::new(format!("g{i}")).expect("name")).collect();
        for g in &names {
            slots.slot(&stream, g).cache.lock().expect("cache lock").aggregate = meta(g);
        }
        // g0 is used again: now the most recent.
        drop(slots.slot(&stream, &names[0]));
        assert_eq!(slots.trim_aggregates(2), 3);
        assert_eq!(slots.cached_aggregates(), 2);
        let kept = |g: &GroupName| slots.slot(&stream, g).memory().aggregate.is_some();
        assert!(kept(&names[0]) && kept(&names[4]), "the two most recently used stay");
        assert!(!kept(&names[1]) && !kept(&names[2]) && !kept(&names[3]));
        assert_eq!(slots.trim_aggregates(2), 0, "within the budget: nothing dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_in_use_outlives_the_retention() {
        let slots = Slots::default();
        let (stream, group) = (StreamName::new("s").expect("name"), GroupName::new("g").expect("name"));
        let slot = slots.slot(&stream, &group);
        slot.mark_present();
        tokio::time::advance(2 * SLOT_RETENTION).await;
        assert_eq!(slots.evict_idle(), 1, "still used by a request");
        drop(slot);
        assert_eq!(slots.evict_idle(), 0);
    }
}
