//! The critical section of a group: the [`Section`] that loads a group's metadata (from this process's cache
//! when it is current) and liveness, decides the grace and suspected loss ([`grace`]), runs a state-machine
//! input and writes the transition.

use protocol::metadata::GroupMetadata;
use protocol::names::{GroupName, StreamName};
use protocol::StoreRevision;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::{debug, info, warn};

use crate::error::{Error, StoreError};
use crate::group_slots::{GroupMemory, GroupSlot, Slots};
use crate::missing_metadata;
use crate::recent::RecentRebalances;
use crate::section::{store_error, unavailable, Section, Verdict};
use crate::state_machine::grace::{self, Suspicion};
use crate::state_machine::{Clock, Event, Liveness, Transition};
use crate::stats::Stats;
use crate::store::{self, Cached, LivenessScope, Loaded, SectionKeys, Store, Write};

/// A group decision: the loaded metadata, liveness, clock and revision to a transition; an error refuses.
pub(crate) trait Decide:
    FnMut(&GroupMetadata, &Liveness, Clock, StoreRevision) -> Result<Transition, Error>
{
}

impl<F> Decide for F where F: FnMut(&GroupMetadata, &Liveness, Clock, StoreRevision) -> Result<Transition, Error> {}

/// What a group section needs of its coordinator besides the [`crate::section::Env`].
#[derive(Clone, Copy)]
pub(crate) struct GroupEnv<'a> {
    pub store: &'a Store,
    pub stats: &'a Stats,
    pub slots: &'a Slots,
    pub recent: &'a RecentRebalances,
    /// Redis time (ms) before which nobody is expired, after a Redis restart.
    pub global_grace_until_ms: &'a AtomicU64,
}

/// One section of one group. `f` decides; it may refuse with an error after seeing the loaded revision (admin
/// `If-Match`): nothing is written then.
pub(crate) struct GroupSection<'a, F> {
    pub env: GroupEnv<'a>,
    pub stream: &'a StreamName,
    pub group: &'a GroupName,
    pub slot: &'a GroupSlot,
    pub scope: LivenessScope<'a>,
    pub f: F,
    /// The state of the current attempt.
    pub attempt: Attempt,
}

/// What one attempt of a group section loaded and decided.
#[derive(Default)]
pub(crate) struct Attempt {
    /// What this process remembered when the attempt loaded.
    memory: GroupMemory,
    decided: Option<Decided>,
}

/// A transition waiting for its write.
struct Decided {
    transition: Transition,
    json: Option<String>,
}

impl<F: Decide> GroupSection<'_, F> {
    fn corrupt(&self, message: String) -> Error {
        self.env.stats.metadata_corrupt.fetch_add(1, Ordering::Relaxed);
        unavailable(self.env.stats, message)
    }

    /// Resolves the loaded metadata (cache or decode), the grace period, and runs `f`.
    fn transition(&mut self, loaded: &Loaded) -> Result<(Transition, StoreRevision), Error> {
        let (stream, group, slot) = (self.stream, self.group, self.slot);
        let Some(rev) = loaded.revision else {
            slot.drop_aggregate();
            // Counted by `missing_metadata::group`, which tells a lost group (counted) from a never-created one.
            return Err(missing_metadata::missing_group(stream, group));
        };
        // Every load is checked, cached or not: the cache only saves the JSON parse.
        store::check_versions(loaded, store::schema_of_group()).map_err(|e| self.corrupt(e))?;
        let meta = match (&loaded.aggregate, &self.attempt.memory.aggregate) {
            (Some(json), _) => store::decode_group(loaded, json).map(Arc::new).map_err(|e| {
                // The cached aggregate is not the stored one any more.
                slot.drop_aggregate();
                self.corrupt(e)
            })?,
            (None, Some((cached_rev, meta))) if loaded.cache_hit && *cached_rev == rev => meta.clone(),
            (None, _) => {
                return Err(self.corrupt(format!("group {group} metadata hash has a revision but no aggregate")));
            }
        };
        let remembered = grace::Remembered {
            highest: self.attempt.memory.highest,
            grace_until_ms: self.attempt.memory.grace_until_ms,
        };
        let facts = grace::Loaded {
            now_ms: loaded.now_ms,
            run_id_changed: loaded.run_id_changed(),
            liveness_missing: loaded.liveness_missing,
            global_grace_until_ms: self.env.global_grace_until_ms.load(Ordering::Acquire),
        };
        let assessment = grace::assess(&meta, remembered, facts);
        for suspicion in &assessment.suspicions {
            self.env.stats.metadata_regressions.fetch_add(1, Ordering::Relaxed);
            match suspicion {
                Suspicion::Regressed { stored, seen } => warn!(group = %group, stored = %stored, seen = %seen,
                    "metadata version regressed under this coordinator: correction round, no expiry for one member TTL"),
                Suspicion::RunIdChanged => warn!(group = %group, stored_run_id = %loaded.stored_run_id,
                    run_id = %loaded.run_id,
                    "group metadata outlived a Redis restart or failover: correction round, no expiry for one member TTL"),
                Suspicion::LivenessMissing => warn!(group = %group,
                    "liveness hash missing while the group has members: no expiry for one member TTL"),
            }
        }
        {
            let mut memory = slot.cache.lock().expect("cache lock");
            if let Some(json) = &loaded.aggregate {
                memory.digest.clone_from(&loaded.aggregate_digest);
                memory.len = json.len();
            }
            memory.aggregate = Some((rev, meta.clone()));
            memory.highest = assessment.remembered.highest;
            memory.grace_until_ms = assessment.remembered.grace_until_ms;
        }
        let liveness: Liveness = loaded.liveness.iter().cloned().collect::<BTreeMap<_, _>>();
        let t = (self.f)(&meta, &liveness, assessment.clock, rev)?;
        Ok((t, rev))
    }

    fn log_events(&self, events: &[Event]) {
        let (stream, group) = (self.stream, self.group);
        for e in events {
            self.env.stats.event(e);
            self.env.recent.record(stream, group, e);
            self.env.stats.metrics().group_event(stream, group, e);
            match e {
                Event::ShardGranted { .. } | Event::ShardReleased { .. } => {
                    debug!(stream = %stream, group = %group, event = ?e, "coordinator event")
                }
                _ => info!(stream = %stream, group = %group, event = ?e, "coordinator event"),
            }
        }
    }

    #[cfg(feature = "fault-injection")]
    async fn fault(&self, point: crate::fault::Point) -> Result<(), Error> {
        let Some(d) = &self.attempt.decided else { return Ok(()) };
        crate::fault::reached(self.env.stats, point, self.stream, self.group, &d.transition).await
    }
}

impl<F: Decide> Section for GroupSection<'_, F> {
    type Output = (Transition, StoreRevision);

    fn prepare(&mut self) {
        self.attempt.memory = self.slot.memory();
        self.attempt.decided = None;
    }

    fn cached(&self) -> Option<Cached<'_>> {
        self.attempt.memory.aggregate.as_ref().map(|(revision, _)| Cached {
            revision: *revision,
            digest: &self.attempt.memory.digest,
            len: self.attempt.memory.len,
        })
    }

    fn scope(&self) -> LivenessScope<'_> {
        self.scope
    }

    fn decide(&mut self, loaded: &Loaded) -> Result<Verdict<Self::Output>, Error> {
        if loaded.revision.is_some() {
            self.slot.mark_present();
        }
        let (transition, rev) = self.transition(loaded)?;
        if !transition.writes() {
            return Ok(Verdict::Answer((transition, rev)));
        }
        let json = transition.next.as_ref().map(GroupMetadata::encode);
        self.attempt.decided = Some(Decided { transition, json });
        Ok(Verdict::Write)
    }

    async fn refused(&mut self, loaded: &Loaded, e: Error) -> Error {
        if loaded.revision.is_none() {
            // Looked up after the mutex is released: the lookup needs no lock, and only requests for groups
            // without metadata pay for it.
            return missing_metadata::group(self.env.store, self.env.stats, self.env.slots, self.stream, self.group)
                .await;
        }
        e
    }

    async fn before_write(&mut self, _store: &Store, _keys: &SectionKeys) -> Result<(), Error> {
        #[cfg(feature = "fault-injection")]
        self.fault(crate::fault::Point::BeforeWrite).await?;
        Ok(())
    }

    fn write<'a>(&'a self, loaded: &'a Loaded) -> Write<'a> {
        let d = self.attempt.decided.as_ref().expect("decided before the write");
        Write {
            aggregate: d.json.as_deref(),
            replaces: &loaded.aggregate_digest,
            renew: &d.transition.renew,
            forget: &d.transition.forget,
            now_ms: loaded.now_ms,
            run_id: &loaded.run_id,
        }
    }

    fn write_failed(&mut self, e: StoreError) -> Error {
        // The stored aggregate is not the one decided on: never serve that one from memory again.
        self.slot.drop_aggregate();
        store_error(self.env.stats, e)
    }

    async fn committed(&mut self, revision: StoreRevision) -> Result<Self::Output, Error> {
        if let Some(Decided {
            transition: t,
            json: Some(json),
        }) = &self.attempt.decided
        {
            if let Some(next) = &t.next {
                let mut memory = self.slot.cache.lock().expect("cache lock");
                memory.highest = memory.highest.max(next.metadata_version);
                memory.aggregate = Some((revision, Arc::new(next.clone())));
                memory.digest = store::digest(json.as_bytes());
                memory.len = json.len();
            }
        }
        let d = self.attempt.decided.as_ref().expect("decided before the write");
        self.log_events(&d.transition.events);
        #[cfg(feature = "fault-injection")]
        self.fault(crate::fault::Point::AfterWrite).await?;
        let d = self.attempt.decided.take().expect("decided before the write");
        Ok((d.transition, revision))
    }

    fn conflict(&mut self) -> Result<(), Error> {
        debug!(group = %self.group, "revision conflict; reloading");
        // Only the cached aggregate is stale; what this process saw (highest version, grace) stays.
        self.slot.drop_aggregate();
        Ok(())
    }
}
