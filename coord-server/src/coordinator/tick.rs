//! A group's tick visit: read and seal its stream's routing, run the tick input in the group's section, observe
//! its reshards, and give the due index the group's next due time.

use protocol::messages::GroupRef;
use protocol::metadata::StreamRouting;
use protocol::names::{GroupName, StreamName};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tracing::{warn, Instrument};

use super::damaged_keys::{is_wrong_type, Damage, DamagedKey};
use super::{due, Coordinator};
use crate::error::{Error, StoreError};
use crate::spans;
use crate::state_machine::{self, Input};
use crate::store::{self, LivenessScope};

impl Coordinator {
    /// Runs one tick of a group: expiry, fencing, hold ends, routing adoption, closing a correction round; then
    /// writes the group's next due time to the due index (see [`crate::due`]).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn tick_group(&self, stream: &StreamName, group: &GroupName) -> Result<(), Error> {
        let scored = self.visit_group(stream, group, None).await?;
        let g = GroupRef {
            stream: stream.clone(),
            group: group.clone(),
        };
        self.record_due(&[(g, scored)], &[]).await;
        Ok(())
    }

    /// [`Coordinator::tick_group`] without writing the due index: the tick loop writes the scores of all its
    /// visits at once. `tended` is the stream's routing as this tick's [`Coordinator::tend_routing`] left it;
    /// without it the visit reads the routing itself.
    pub(crate) async fn visit_group(
        &self,
        stream: &StreamName,
        group: &GroupName,
        tended: Option<StreamRouting>,
    ) -> Result<due::Scored, Error> {
        let routing = match tended {
            Some(r) => Some(r),
            None => self.routing_to_adopt(stream).await?,
        };
        // Resharding: seal what a growth left unsealed before the group adopts it (see `reshard`).
        let routing = match routing {
            Some(r) => Some(self.seal_growths(stream, &r).await.unwrap_or_else(|e| {
                warn!(stream = %stream, error = %e, "sealing parents failed; retried next tick");
                r
            })),
            None => None,
        };
        let mut needs = Vec::new();
        let mut next_due = None;
        let (_, revision) = self
            .group_section(stream, group, LivenessScope::All, |meta, live, clock, _| {
                let t = state_machine::apply(
                    meta,
                    live,
                    Input::Tick {
                        routing: routing.as_ref(),
                    },
                    clock,
                );
                // The gauges show what the visit leaves (a member it expired is gone): the next visit may be a
                // sweep period away.
                let left = due::liveness_after(live, &t);
                let next = t.next.as_ref().unwrap_or(meta);
                self.inner.stats.metrics().observe_group(next, &left, clock.now_ms);
                needs = state_machine::reshard::needs(t.next.as_ref().unwrap_or(meta));
                next_due = due::tick_due(meta, live, &t, clock, routing.as_ref());
                Ok(t)
            })
            .instrument(spans::section("tick", stream, Some(group)))
            .await?;
        // The tick's own work is recorded; what the reshard observation could not read is looked at next tick.
        if let Err(e) = self.observe_reshards(stream, group, needs).await {
            warn!(stream = %stream, group = %group, error = %e, "reshard observation failed; retried next tick");
        }
        Ok(due::Scored {
            due: next_due,
            revision,
        })
    }

    /// Whether this tick tends the routing of every stream, not only of the streams it visits: for one member
    /// TTL after a Redis restart or failover (`restarted`), the moment Redis may have lost part of a routing, so
    /// that a lost growth is restored within ticks (retried while Redis settles), not within a sweep period; and
    /// on the first tick of this process, which cannot tell what Redis lost while no coordinator ran (the sweep's
    /// visits do not tend, see [`Coordinator::sweeps_tend_routing`]).
    pub(crate) fn tends_every_routing(&self, restarted: bool) -> bool {
        let first = !self.inner.tended_all_once.swap(true, Ordering::Relaxed);
        let now = tokio::time::Instant::now();
        let mut until = self.inner.tend_all_until.lock().expect("tend lock");
        if restarted {
            *until = Some(now + Duration::from_millis(self.max_ttl_ms()));
        }
        first || until.is_some_and(|u| now < u)
    }

    /// Whether a visit of the safety sweep tends its stream's routing (reads its shard records): only where the
    /// shard records live on a Redis whose run id the tick does not watch (a data Redis of its own, see
    /// [`crate::store::Store::split`]). Otherwise Redis loses records only together with a restart, failover or
    /// restore of the server or of a Cluster master, which changes the run id the tick checks, and every routing
    /// is tended for a member TTL after that ([`Coordinator::tends_every_routing`]).
    pub(crate) fn sweeps_tend_routing(&self) -> bool {
        self.inner.store.split()
    }

    /// The routing a visit adopts, read: `None` when the stream has none or it is unreadable. A damaged routing
    /// hash (of the wrong type, a document that does not parse, missing under this group) must not stop the
    /// group's expiry or fencing: the group is ticked without adopting, and the damage is counted and logged.
    /// Nothing repairs it: the routing is the only record of the stream's shard count and growths, so no repair
    /// can be proven to lose nothing (the runbook has the operator's steps).
    async fn routing_to_adopt(&self, stream: &StreamName) -> Result<Option<StreamRouting>, StoreError> {
        let (damage, detail) = match self.inner.store.read_routing(stream).await {
            Ok(Some((_, json))) => match store::decode_routing(&json) {
                Ok(r) => return Ok(Some(r)),
                Err(e) => (Damage::Garbage, e),
            },
            Ok(None) => (Damage::Lost, "no routing hash (or no document in it)".to_owned()),
            Err(StoreError::Corrupt(e)) => (Damage::Garbage, e),
            Err(e) if is_wrong_type(&e) => (Damage::WrongType, e.to_string()),
            Err(e) => return Err(e),
        };
        self.report_damage(
            DamagedKey::Routing,
            damage,
            1,
            Some(stream),
            &format_args!("not adopting: {detail}"),
        );
        Ok(None)
    }
}
