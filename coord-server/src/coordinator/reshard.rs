//! The coordinator's resharding duties around the pure rules of `state_machine::reshard`: seal the parents a
//! growth recorded (right after add-shards, and on every tick until done, so a coordinator that died between the
//! routing commit and the seals finishes them), and observe, per group, the seals and drains its open reshards
//! wait for. Observations are recorded through the group's critical section like every other decision.

use protocol::metadata::StreamRouting;
use protocol::names::{GroupName, StreamName};
use tracing::{info, warn, Instrument};

use futures::{StreamExt, TryStreamExt};

use super::Coordinator;
use crate::error::Error;
use crate::routing_section;
use crate::spans;
use crate::state_machine::reshard::{self, Need, Observation, Seal};
use crate::state_machine::{self, Input};
use crate::store::LivenessScope;
use crate::store_reshard;

/// Seal scripts sent at once by [`Coordinator::seal_growths`].
const SEALS_IN_FLIGHT: usize = 64;

impl Coordinator {
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
        let conn = self.inner.store.connection();
        let seals: Vec<Seal> = futures::stream::iter(todo)
            .map(|(version, shard)| {
                let mut conn = conn.clone();
                async move {
                    let s = store_reshard::seal(&mut conn, stream, shard, version).await?;
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
        let mut conn = self.inner.store.connection();
        let mut observed = Vec::new();
        for need in needs {
            match need {
                Need::Seal { routing_version, shard } => {
                    let s = store_reshard::seal(&mut conn, stream, shard, routing_version).await?;
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
                } => {
                    let d = store_reshard::drain_state(&mut conn, stream, group, shard, seal).await?;
                    if d.fence < routing_version {
                        // The fence is gone (a Redis rollback): producers of the old routing could have written
                        // after the recorded seal. Seal again; the parent drains up to the new position.
                        warn!(stream = %stream, group = %group, shard = %shard, version = %routing_version,
                            fence = %d.fence, "parent fence lost; sealing again");
                        let s = store_reshard::seal(&mut conn, stream, shard, routing_version).await?;
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
