//! The coordinator's resharding duties around the pure rules of `state_machine::reshard`: seal the parents a
//! growth recorded (right after add-shards, and on every tick until done, so a coordinator that died between the
//! routing commit and the seals finishes them), and observe, per group, the seals and drains its open reshards
//! wait for. Observations are recorded through the group's critical section like every other decision.

use protocol::messages::RoutingDescription;
use protocol::metadata::{StreamRouting, MAX_SHARDS};
use protocol::names::{GroupName, StreamName};
use protocol::reshard::Birth;
use protocol::{RoutingVersion, ShardId, StoreRevision};
use tracing::{info, warn, Instrument};

use futures::{StreamExt, TryStreamExt};

use super::{routing_description, Coordinator};
use crate::error::Error;
use crate::missing_metadata;
use crate::quota::TokenQuota;
use crate::routing_section;
use crate::spans;
use crate::state_machine::reshard::{self, Need, Observation, Seal};
use crate::state_machine::routing::Report;
use crate::state_machine::{self, Input};
use crate::store::{self, LivenessScope};

/// Seal scripts sent at once by [`Coordinator::seal_growths`].
const SEALS_IN_FLIGHT: usize = 64;

/// Shard records the tick's sweep reads per stream and tick: every record of a 65,536-shard stream is looked at
/// within 1,024 ticks, at 64 pipelined reads per tick.
const RECORD_SWEEP: u32 = 64;

impl Coordinator {
    /// Grows a stream by `count` shards and seals every old shard (the parents, see `docs/resharding.md`).
    /// Groups adopt the new routing on their next tick and read the new shards once they drained the parents.
    ///
    /// # Errors
    /// [`Error::RevisionConflict`] when `if_match` is stale; [`Error::NotFound`] when the stream was never
    /// created; [`Error::MetadataUnavailable`] when its routing is lost.
    pub async fn add_shards(
        &self,
        stream: &StreamName,
        count: u32,
        if_match: Option<StoreRevision>,
    ) -> Result<RoutingDescription, Error> {
        self.add_shards_within(stream, count, if_match, None).await
    }

    /// As [`Coordinator::add_shards`], refused with `QUOTA_EXCEEDED` (nothing written) when the stream would have
    /// more shards than `quota` allows per group (`None`: no quota). The limit is checked in the routing
    /// section's decision, on the count it grows, so concurrent growths on any replicas stop at it.
    ///
    /// # Errors
    /// As [`Coordinator::add_shards`], and `QUOTA_EXCEEDED`.
    pub async fn add_shards_within(
        &self,
        stream: &StreamName,
        count: u32,
        if_match: Option<StoreRevision>,
        quota: Option<&TokenQuota>,
    ) -> Result<RoutingDescription, Error> {
        // Checked before If-Match and the stored count, so an impossible count is refused as such whatever is stored.
        if count == 0 || count >= MAX_SHARDS {
            return Err(Error::InvalidRequest(format!("count must be 1 to {}", MAX_SHARDS - 1)));
        }
        if let Some(q) = quota {
            self.check_growth_unlocked(q, stream, count).await?;
        }
        let (inner, mut absent) = (&self.inner, false);
        let ceiling = self.growth_ceiling(stream);
        let grown = self
            .probing_routing_section(stream, |loaded, probed| {
                absent = loaded.revision.is_none();
                routing_section::grow(
                    &inner.stats,
                    loaded,
                    probed,
                    stream,
                    routing_section::GrowRequest {
                        count,
                        if_match,
                        ceiling,
                        quota,
                    },
                )
            })
            .instrument(spans::section("add_shards", stream, None))
            .await;
        if absent && grown.is_err() {
            // Never created (404) or lost (503), told apart from Redis's traces as for every other request.
            return Err(missing_metadata::stream(&inner.store, &inner.stats, &inner.slots, stream).await);
        }
        let (routing, rev) = grown?;
        // The stream's groups adopt the growth on their next visit; adoption is no deadline of theirs.
        self.make_stream_due(stream).await;
        // The parents were sealed and the children recorded before the routing was committed (see
        // `routing_section`); a growth recorded unsealed by an older coordinator is finished by the tick.
        info!(stream = %stream, shard_count = routing.shard_count, routing_version = %routing.routing_version, "shards added");
        Ok(routing_description(&routing, rev, None))
    }

    /// Restores `stream`'s routing from what Redis holds of it (its shards' records and fences, shard keys
    /// beyond it that hold entries: see `state_machine::routing`; `report`, the client's report that prompted the
    /// look if one did, is never believed), within the stream's growth ceiling, and gives a routing written before
    /// shard records existed its records. Returns the routing as stored afterwards.
    ///
    /// # Errors
    /// A Redis failure (nothing is committed then: seals and records already written only hold producers back
    /// until the next try); [`Error::MetadataUnavailable`] when the stream has no routing.
    pub(crate) async fn restore_routing(
        &self,
        stream: &StreamName,
        report: Option<Report>,
    ) -> Result<StreamRouting, Error> {
        self.restore_routing_above(stream, report, RoutingVersion(0)).await
    }

    /// As [`Coordinator::restore_routing`], with `fence_seen` as evidence besides shard 0's fence: the highest
    /// fence the tick's sweep found on the shards the routing lists (a growth that sealed them was lost while
    /// shard 0's master lost its seal too).
    async fn restore_routing_above(
        &self,
        stream: &StreamName,
        report: Option<Report>,
        fence_seen: RoutingVersion,
    ) -> Result<StreamRouting, Error> {
        let stats = &self.inner.stats;
        let ceiling = self.growth_ceiling(stream);
        let mut why = Vec::new();
        let mut before = None;
        let (routing, _) = self
            .probing_routing_section(stream, |loaded, probed| {
                before = store::decode_routing(loaded.aggregate.as_deref().unwrap_or_default())
                    .ok()
                    .map(|r| (r.routing_version, r.shard_count));
                let probed = routing_section::Probed {
                    fence: probed.fence.max(fence_seen),
                    ..probed.clone()
                };
                let (step, w) = routing_section::restore(stats, loaded, &probed, report, ceiling)?;
                why = w;
                Ok(step)
            })
            .instrument(spans::section("restore_routing", stream, None))
            .await?;
        if !why.is_empty() {
            self.make_stream_due(stream).await;
            stats.metrics().routing_restored(&why);
            warn!(stream = %stream, why = ?why, before = ?before, routing_version = %routing.routing_version,
                shard_count = routing.shard_count, "routing restored: Redis had lost part of it");
        }
        stats.metrics().shards_beyond_routing(stream, 0);
        Ok(routing)
    }

    /// The tick's look at a stream's routing, in one batch of record reads: shard 0's fence, the record of the
    /// first shard beyond the routing, and the next [`RECORD_SWEEP`] records ([`Coordinator::sweep_records`]). A
    /// restoration ([`Coordinator::restore_routing`]) only when they show that Redis lost part of the routing, or
    /// when the routing has no shard records yet. Answers the routing as it stands afterwards, which the tick's
    /// visits of the stream's groups adopt without reading it again.
    ///
    /// # Errors
    /// A Redis failure, or an unreadable routing.
    pub async fn tend_routing(&self, stream: &StreamName) -> Result<StreamRouting, Error> {
        let (_, r) = self.read_routing(stream).await?;
        let window = self.record_window(stream, &r);
        let mut shards: Vec<ShardId> = window.iter().map(|b| b.shard).collect();
        let swept = shards.len();
        // Shard 0 is in the window of every stream of up to RECORD_SWEEP shards: read once.
        let zero = match shards.first() {
            Some(ShardId(0)) => 0,
            _ => {
                shards.push(ShardId(0));
                shards.len() - 1
            }
        };
        if r.shard_count < MAX_SHARDS {
            shards.push(ShardId(r.shard_count));
        }
        let found = store::reshard::swept(&self.inner.store.data().connection(), stream, &shards).await?;
        let fence = found[zero].fence;
        let beyond = (r.shard_count < MAX_SHARDS)
            .then(|| found[shards.len() - 1].birth)
            .flatten();
        self.inner
            .stats
            .metrics()
            .shards_beyond_routing(stream, u32::from(beyond.is_some()));
        if fence > r.routing_version || beyond.is_some() || !r.shard_records {
            return self.restore_routing(stream, None).await;
        }
        match self.sweep_records(stream, &r, window, &found[..swept]).await? {
            Some(seen) => self.restore_routing_above(stream, None, seen).await,
            None => Ok(r),
        }
    }

    /// The births of the [`RECORD_SWEEP`] shards the next [`Coordinator::sweep_records`] of `stream` looks at,
    /// resuming where the last one stopped.
    fn record_window(&self, stream: &StreamName, r: &StreamRouting) -> Vec<Birth> {
        let start = {
            let sweep = self.inner.record_sweep.lock().expect("record sweep lock");
            sweep.get(stream).copied().unwrap_or(0) % r.shard_count.max(1)
        };
        let end = (start + RECORD_SWEEP).min(r.shard_count);
        routing_section::migration_records(r)[start as usize..end as usize].to_vec()
    }

    /// Writes again the records of shards the routing lists but Redis lost (on a Cluster each record lives on
    /// the master of its own slot, and a failover there loses it while the routing keeps the shard): without it,
    /// every fenced publish to the shard would be refused. `window` ([`Coordinator::record_window`]) are the
    /// shards looked at, `found` what their records hold. A record is written only where none is (never
    /// overwriting one), with the birth the routing's growths give the shard. A record that names a layout with
    /// more shards than the routing at or below its version (a Cluster master that lost the retirement's seal
    /// kept a lost layout's) gets the routing's count ([`store::reshard::recount`]), else that layout's producers
    /// would be refused there for good.
    ///
    /// Answers the highest fence above the routing's version it saw (`None`: none): a growth that sealed those
    /// shards was lost, and the caller restores the routing past it.
    async fn sweep_records(
        &self,
        stream: &StreamName,
        r: &StreamRouting,
        window: Vec<Birth>,
        found: &[store::reshard::SweptRecord],
    ) -> Result<Option<RoutingVersion>, Error> {
        let end = window.last().map_or(0, |b| b.shard.0 + 1);
        let conn = self.inner.store.data().connection();
        let shards: Vec<ShardId> = window.iter().map(|b| b.shard).collect();
        let fence_above = found.iter().map(|f| f.fence).filter(|&f| f > r.routing_version).max();
        let recount: Vec<ShardId> = found
            .iter()
            .zip(&shards)
            .filter(|(f, _)| f.names_more_shards(r.routing_version, r.shard_count))
            .map(|(_, &s)| s)
            .collect();
        let lost: Vec<Birth> = window
            .into_iter()
            .zip(found)
            .filter_map(|(b, f)| f.birth.is_none().then_some(b))
            .collect();
        for b in &lost {
            store::reshard::record(&mut conn.clone(), stream, *b).await?;
        }
        for &s in &recount {
            store::reshard::recount(&mut conn.clone(), stream, s, r.routing_version, r.shard_count).await?;
        }
        if !recount.is_empty() {
            warn!(stream = %stream, shards = ?recount.iter().map(|s| s.0).collect::<Vec<_>>(),
                "shard records named a layout with more shards than the routing: counts lowered to it");
        }
        if !lost.is_empty() {
            self.inner
                .stats
                .metrics()
                .routing_restored(&[state_machine::routing::Why::RecordLost]);
            warn!(stream = %stream, shards = ?lost.iter().map(|b| b.shard.0).collect::<Vec<_>>(),
                "shard records written again: Redis had lost them");
        }
        self.inner
            .record_sweep
            .lock()
            .expect("record sweep lock")
            .insert(stream.clone(), if end >= r.shard_count { 0 } else { end });
        Ok(fence_above)
    }

    /// Seals every parent of `routing`'s growths still unsealed and records the positions in the routing.
    /// Returns the routing as recorded afterwards (`routing` itself when nothing was to seal).
    ///
    /// # Errors
    /// A Redis failure of a seal or of the routing write; the seals already taken stay valid (a later seal of
    /// the same parent records the first position, see [`reshard::record_seals`]).
    pub(super) async fn seal_growths(
        &self,
        stream: &StreamName,
        routing: &StreamRouting,
    ) -> Result<StreamRouting, Error> {
        let todo = reshard::unsealed(routing);
        if todo.is_empty() {
            return Ok(routing.clone());
        }
        // Concurrent on the multiplexed connection (so pipelined): a growth of a large stream seals up to
        // MAX_SHARDS parents, and one round trip each would outlast the request timeout.
        let conn = self.inner.store.data().connection();
        let seals: Vec<Seal> = futures::stream::iter(todo)
            .map(|(version, shard)| {
                let mut conn = conn.clone();
                async move {
                    let count = routing
                        .growths
                        .iter()
                        .find(|g| g.routing_version == version)
                        .map_or(0, |g| g.shard_count);
                    let s = store::reshard::seal(&mut conn, stream, shard, version, count).await?;
                    Ok::<_, Error>(Seal {
                        routing_version: version,
                        shard,
                        position: s.position,
                    })
                }
            })
            .buffered(SEALS_IN_FLIGHT)
            .try_collect()
            .await?;
        let stats = &self.inner.stats;
        let (recorded, _) = self
            .routing_section(stream, |loaded| {
                routing_section::record_seals(stats, loaded, &seals, routing)
            })
            .instrument(spans::section("seal", stream, None))
            .await?;
        // The groups copy the seals on their next visit.
        self.make_stream_due(stream).await;
        info!(stream = %stream, parents = seals.len(), "parents sealed");
        Ok(recorded)
    }

    /// Looks in Redis for what the group's open reshards wait for (`needs`, from [`reshard::needs`] of the
    /// metadata the tick recorded) and records what it found. Does nothing without needs.
    ///
    /// # Errors
    /// A Redis failure; nothing is recorded then, and the next tick looks again.
    pub(super) async fn observe_reshards(
        &self,
        stream: &StreamName,
        group: &GroupName,
        needs: Vec<Need>,
    ) -> Result<(), Error> {
        if needs.is_empty() {
            return Ok(());
        }
        let mut conn = self.inner.store.data().connection();
        let mut observed = Vec::new();
        for need in needs {
            match need {
                Need::Seal {
                    routing_version,
                    shard,
                    shard_count,
                } => {
                    let s = store::reshard::seal(&mut conn, stream, shard, routing_version, shard_count).await?;
                    observed.push(Observation::Sealed(Seal {
                        routing_version,
                        shard,
                        position: s.position,
                    }));
                }
                Need::Drain {
                    routing_version,
                    shard,
                    seal,
                    shard_count,
                } => {
                    let d = store::reshard::drain_state(&mut conn, stream, group, shard, seal).await?;
                    if d.fence < routing_version {
                        // The fence is gone (a Redis rollback): producers of the old routing could have written
                        // after the recorded seal. Seal again; the parent drains up to the new position.
                        warn!(stream = %stream, group = %group, shard = %shard, version = %routing_version,
                            fence = %d.fence, "parent fence lost; sealing again");
                        let s = store::reshard::seal(&mut conn, stream, shard, routing_version, shard_count).await?;
                        observed.push(Observation::Resealed(Seal {
                            routing_version,
                            shard,
                            position: s.position,
                        }));
                    } else if d.drained(seal) {
                        observed.push(Observation::Drained {
                            routing_version,
                            shard,
                            seal,
                        });
                    }
                }
            }
        }
        if observed.is_empty() {
            return Ok(());
        }
        self.group_section(stream, group, LivenessScope::All, |meta, live, clock, _| {
            Ok(state_machine::apply(meta, live, Input::Reshard(&observed), clock))
        })
        .instrument(spans::section("reshard", stream, Some(group)))
        .await?;
        Ok(())
    }
}
