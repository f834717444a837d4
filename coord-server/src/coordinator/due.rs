//! The coordinator's side of the due index (see [`crate::due`]): which groups a tick visits, and writing their
//! scores after visits, commits, routing changes and creation.

use super::damaged_keys::{is_wrong_type, warn_limited, Damage, DamagedKey};
use super::Coordinator;
use crate::due::Reason;
use crate::error::Error;
use crate::state_machine::due::visit_due_ms;
use crate::state_machine::{Clock, Liveness, Transition};
use crate::store::{self, DueScore};
use futures::future::join_all;
use protocol::keys;
use protocol::messages::GroupRef;
use protocol::metadata::{GroupMetadata, StreamRouting};
use protocol::names::{GroupName, StreamName};
use protocol::StoreRevision;
use std::sync::atomic::Ordering;

/// What a visit or commit leaves for the due index: the group's next due time (`None`: none) and the revision
/// it was computed from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scored {
    pub due: Option<u64>,
    pub revision: StoreRevision,
}

/// The liveness a transition leaves: the loaded entries, renewed and forgotten as it writes.
pub(super) fn liveness_after(live: &Liveness, t: &Transition) -> Liveness {
    let mut live = live.clone();
    for (m, lease) in &t.renew {
        let e = live.entry(m.clone()).or_insert(0);
        *e = (*e).max(*lease);
    }
    for m in &t.forget {
        live.remove(m);
    }
    live
}

/// The due time of what a transition leaves: its next aggregate (or the loaded one) with the liveness it leaves,
/// and the gauges' own refresh ([`crate::due::observe_by`]).
pub(super) fn due_after(meta: &GroupMetadata, live: &Liveness, t: &Transition, clock: Clock) -> Option<u64> {
    let next = t.next.as_ref().unwrap_or(meta);
    let live = liveness_after(live, t);
    let due = visit_due_ms(next, &live, clock.expiry_allowed_from_ms);
    let observe = crate::due::observe_by(next, clock.now_ms, t.next.is_some());
    match (due, observe) {
        (Some(d), Some(o)) => Some(d.min(o)),
        (d, o) => d.or(o),
    }
}

/// A tick's due time, also at once while the stream's routing waits to be adopted: a routing refused only
/// because the group has too many open reshards is adopted on the tick after they close (and those reshards keep
/// the group due meanwhile); one with fewer shards than the group is refused for good, and no reason to revisit.
pub(super) fn tick_due(
    meta: &GroupMetadata,
    live: &Liveness,
    t: &Transition,
    clock: Clock,
    routing: Option<&StreamRouting>,
) -> Option<u64> {
    let next = t.next.as_ref().unwrap_or(meta);
    let adoptable =
        routing.is_some_and(|r| r.routing_version != next.routing_version && r.shard_count >= next.shard_count);
    if adoptable {
        return Some(0);
    }
    due_after(meta, live, t, clock)
}

impl Coordinator {
    /// The groups this tick visits: those the due index says are due by Redis time (at most
    /// [`crate::Config::due_batch`]), then the safety sweep's slice of the others.
    ///
    /// The sweep does not depend on the due index: an index Redis cannot read (of the wrong type, or a failed
    /// read) gives no due groups this tick, never no tick. An index of the wrong type is counted and replaced
    /// ([`Coordinator::repair_due_index`]); members that name no group are counted and removed (they would stay
    /// due for ever and take a place in every batch). A sweep list that fails to load is logged and retried next
    /// tick.
    pub async fn groups_to_visit(&self) -> Vec<(GroupRef, Reason)> {
        let config = &self.inner.config;
        let due = match self.inner.store.due_groups(config.due_batch).await {
            Ok((_, due)) => due,
            Err(e) if is_wrong_type(&e) => {
                self.report_damage(DamagedKey::DueIndex, Damage::WrongType, 1, None, &e);
                self.repair_due_index().await;
                Vec::new()
            }
            Err(e) => {
                let e = Error::from(e);
                self.inner.stats.metrics().error(&e);
                warn_limited(
                    "read/due_index",
                    "cannot read the due index; only the safety sweep visits",
                    &e,
                );
                Vec::new()
            }
        };
        let mut visits: Vec<(GroupRef, Reason)> = Vec::with_capacity(due.len());
        let mut unreadable = Vec::new();
        for member in due {
            match store::group_refs(std::slice::from_ref(&member)).pop() {
                Some(g) => visits.push((g, Reason::Due)),
                None => unreadable.push(member),
            }
        }
        if !unreadable.is_empty() {
            // Safe to remove: a member that names no group is visited by nothing, and the due index holds no
            // other fact (a group's score is written again by its next visit).
            self.report_damage(
                DamagedKey::DueIndex,
                Damage::Garbage,
                unreadable.len() as u64,
                None,
                &"members that name no group are removed",
            );
            if let Err(e) = self.inner.store.clear_due(&unreadable).await {
                warn_limited(
                    "write/due_index",
                    "cannot write the due index; the safety sweep repairs it",
                    &e,
                );
            }
        }
        let period = config.due_sweep_period;
        let new_round = self.inner.sweep.lock().expect("sweep lock").round_due(period);
        if new_round {
            match self.sweep_groups().await {
                Ok(groups) => self.inner.sweep.lock().expect("sweep lock").start(groups),
                Err(e) => {
                    self.inner.stats.metrics().error(&e);
                    warn_limited(
                        "read/sweep",
                        "cannot list groups for the safety sweep; retried next tick",
                        &e,
                    );
                }
            }
        }
        let slice = self.inner.sweep.lock().expect("sweep lock").take(period);
        for g in slice {
            if !visits.iter().any(|(d, _)| *d == g) {
                visits.push((g, Reason::Sweep));
            }
        }
        visits
    }

    /// Counts a visit for the metrics.
    pub(crate) fn count_visit(&self, reason: Reason) {
        let stats = &self.inner.stats;
        match reason {
            Reason::Due => stats.tick_visits_due.fetch_add(1, Ordering::Relaxed),
            Reason::Sweep => stats.tick_visits_sweep.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Writes the scores of `scored` groups in one `ZADD`, then reads each group's revision again: a group
    /// committed since its score was computed is made due at once (see [`crate::due`] on crossing writers).
    /// Removes `gone` groups (metadata missing or unreadable: the sweep visits them again). Failures are logged:
    /// a score not written leaves the old one, which was due already or is corrected by the sweep.
    ///
    /// Returns how many of the `scored` groups the index lacked: every group is in the index from its creation
    /// on (at once due, then scored by each visit, `+inf` for no deadline), so a visit that adds one found an
    /// entry the index had lost (deleted, evicted, lost with a failover); 0 when the write failed.
    pub(crate) async fn record_due(&self, scored: &[(GroupRef, Scored)], gone: &[GroupRef]) -> u64 {
        match self.try_record_due(scored, gone).await {
            Ok(lacked) => lacked,
            Err(e) => {
                self.inner.stats.metrics().error(&e);
                warn_limited(
                    "write/due_index",
                    "cannot write the due index; the safety sweep repairs it",
                    &e,
                );
                0
            }
        }
    }

    async fn try_record_due(&self, scored: &[(GroupRef, Scored)], gone: &[GroupRef]) -> Result<u64, Error> {
        let store = &self.inner.store;
        let member = |g: &GroupRef| keys::groups_index_member(&g.stream, &g.group);
        let scores: Vec<DueScore> = scored.iter().map(|(g, s)| (member(g), s.due)).collect();
        let lacked = store.set_due(&scores).await?;
        let revisions = join_all(scored.iter().map(|(g, _)| store.revision(&g.stream, &g.group))).await;
        let mut moved = Vec::new();
        for ((g, s), rev) in scored.iter().zip(revisions) {
            if rev? != Some(s.revision) {
                moved.push((member(g), Some(0)));
            }
        }
        store.set_due(&moved).await?;
        let gone: Vec<String> = gone.iter().map(member).collect();
        store.clear_due(&gone).await?;
        Ok(lacked)
    }

    /// Makes a group due at once (created, recreated).
    pub(crate) async fn make_due(&self, stream: &StreamName, group: &GroupName) {
        let scores = [(keys::groups_index_member(stream, group), Some(0))];
        if let Err(e) = self.inner.store.set_due(&scores).await {
            let detail = format!("{stream}/{group}: {e}");
            warn_limited(
                "write/due_index",
                "cannot write the due index; the safety sweep repairs it",
                &detail,
            );
        }
    }

    /// Makes every indexed group of `stream` due at once: its routing changed, and adopting it is no deadline.
    /// Reads the whole groups index; routing commits are rare.
    pub(crate) async fn make_stream_due(&self, stream: &StreamName) {
        let result = async {
            let raw = self.inner.store.indexed_groups().await?;
            let scores: Vec<DueScore> = store::group_refs(&raw)
                .into_iter()
                .filter(|g| g.stream == *stream)
                .map(|g| (keys::groups_index_member(&g.stream, &g.group), Some(0)))
                .collect();
            self.inner.store.set_due(&scores).await
        }
        .await;
        if let Err(e) = result {
            let detail = format!("{stream}: {e}");
            warn_limited(
                "write/due_index",
                "cannot write the due index; the safety sweep repairs it",
                &detail,
            );
        }
    }
}
