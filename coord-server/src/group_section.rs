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
use crate::store::group_fields::{self, GroupRead, StoredFields};
use crate::store::{self, Cached, FieldWrite, LivenessScope, Loaded, SectionKeys, Store, Write};

/// How often a tick's load compares the digest of every stored field with what this process holds (O(fields) in
/// Redis: for a group of 10,000 members some milliseconds), so that an edit outside a commit that keeps every
/// field's length is noticed within this period. Other loads compare the count and lengths of fields only.
pub(crate) const VERIFY_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

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
    /// The metadata the decision read and its stored fields.
    loaded: Option<(Arc<GroupMetadata>, Arc<StoredFields>)>,
    /// SHA-1 of the aggregate loaded when the hash is still in the layout before fields (this section converts
    /// it); empty otherwise.
    converts: String,
    /// [`StoredFields::shape`] of the cached fields for this section's members.
    shape: String,
    /// Whether this load compares every stored field's digest ([`VERIFY_PERIOD`]).
    verify: bool,
    decided: Option<Decided>,
}

/// A transition waiting for its write.
struct Decided {
    transition: Transition,
    /// The fields to write (`None`: renewals only).
    fields: Option<FieldWrite>,
    /// The metadata as written.
    next: Option<Arc<GroupMetadata>>,
}

impl<F: Decide> GroupSection<'_, F> {
    fn corrupt(&self, message: String) -> Error {
        self.env.stats.metadata_corrupt.fetch_add(1, Ordering::Relaxed);
        unavailable(self.env.stats, message)
    }

    /// Resolves the loaded metadata (cache, changes since it, or everything), the grace period, and runs `f`.
    fn transition(&mut self, loaded: &Loaded) -> Result<(Transition, StoreRevision), Error> {
        let (stream, group, slot) = (self.stream, self.group, self.slot);
        let Some(rev) = loaded.revision else {
            slot.drop_aggregate();
            // Counted by `missing_metadata::group`, which tells a lost group (counted) from a never-created one.
            return Err(missing_metadata::missing_group(stream, group));
        };
        let memory = &self.attempt.memory;
        let cached = match (&memory.aggregate, &memory.fields) {
            (Some((cached_rev, meta)), Some(fields)) if fields.revision == cached_rev.0 => Some((meta, fields)),
            _ => None,
        };
        let (meta, fields) = match (&loaded.group, cached) {
            // Every load is checked, cached or not: a hit still had its versions checked by the script and here.
            (Some(GroupRead::Hit), Some((meta, fields))) if fields.revision == rev.0 => {
                store::check_versions(loaded, store::schema_of_group()).map_err(|e| self.corrupt(e))?;
                (meta.clone(), fields.clone())
            }
            _ => {
                let resolved = store::decode_group(loaded, cached.map(|(m, f)| (m.as_ref(), f.as_ref())));
                let (meta, fields) = resolved.map_err(|e| {
                    // What this process holds is not what is stored any more.
                    slot.drop_aggregate();
                    self.corrupt(e)
                })?;
                (Arc::new(meta), Arc::new(fields))
            }
        };
        self.attempt.converts = match &loaded.group {
            Some(GroupRead::Aggregate(json)) => store::digest(json),
            _ => String::new(),
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
            if self.attempt.converts.is_empty() {
                let read_all = !matches!(loaded.group, Some(GroupRead::Hit | GroupRead::Delta(_)));
                if read_all || self.attempt.verify {
                    memory.verified_at = Some(std::time::Instant::now());
                }
                memory.digest = store::group_fields::digest_hex(fields.xor());
                memory.fields = Some(fields.clone());
                memory.aggregate = Some((rev, meta.clone()));
            } else {
                // Not cached in the layout before fields: the section converts it, and caches what it wrote.
                memory.aggregate = None;
                memory.fields = None;
            }
            memory.highest = assessment.remembered.highest;
            memory.grace_until_ms = assessment.remembered.grace_until_ms;
        }
        self.attempt.loaded = Some((meta.clone(), fields));
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
        self.attempt.loaded = None;
        self.attempt.converts.clear();
        self.attempt.decided = None;
        let members: Vec<&protocol::names::MemberId> = match self.scope {
            LivenessScope::Member(m) => vec![m],
            LivenessScope::Members(ms) => ms.to_vec(),
            LivenessScope::None | LivenessScope::All => Vec::new(),
        };
        self.attempt.shape = self
            .attempt
            .memory
            .fields
            .as_ref()
            .map(|f| f.shape(&members))
            .unwrap_or_default();
        self.attempt.verify = matches!(self.scope, LivenessScope::All)
            && self
                .attempt
                .memory
                .verified_at
                .is_none_or(|t| t.elapsed() >= VERIFY_PERIOD);
    }

    fn cached(&self) -> Option<Cached<'_>> {
        let memory = &self.attempt.memory;
        match (&memory.aggregate, &memory.fields) {
            (Some((revision, _)), Some(fields)) if fields.revision == revision.0 => Some(Cached {
                revision: *revision,
                digest: &memory.digest,
                len: 0,
                shape: (!self.attempt.verify).then_some(self.attempt.shape.as_str()),
            }),
            _ => None,
        }
    }

    fn scope(&self) -> LivenessScope<'_> {
        self.scope
    }

    fn decide(&mut self, loaded: &Loaded) -> Result<Verdict<Self::Output>, Error> {
        if loaded.revision.is_some() {
            self.slot.mark_present();
        }
        let (transition, rev) = self.transition(loaded)?;
        let converts = !self.attempt.converts.is_empty();
        if !transition.writes() && !converts {
            return Ok(Verdict::Answer((transition, rev)));
        }
        let (meta, stored) = self.attempt.loaded.as_ref().expect("loaded before deciding");
        let next = transition.next.clone().map(Arc::new);
        let fields = if converts {
            // The layout before fields, converted as it is (or as this decision changes it): the same metadata
            // in fields, nothing reassigned by the conversion itself.
            let written = next.as_deref().unwrap_or(meta);
            Some(FieldWrite {
                changes: group_fields::all_fields(written)
                    .into_iter()
                    .map(|(name, json)| (name, Some(json), String::new()))
                    .collect(),
                converts: self.attempt.converts.clone(),
            })
        } else {
            next.as_deref().map(|next| FieldWrite {
                changes: group_fields::changed_fields(meta, next)
                    .into_iter()
                    .map(|(name, json)| {
                        let expect = stored.expected(&name);
                        (name, json, expect)
                    })
                    .collect(),
                converts: String::new(),
            })
        };
        let next = next.or_else(|| converts.then(|| meta.clone()));
        self.attempt.decided = Some(Decided {
            transition,
            fields,
            next,
        });
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
            aggregate: None,
            replaces: "",
            renew: &d.transition.renew,
            forget: &d.transition.forget,
            now_ms: loaded.now_ms,
            run_id: &loaded.run_id,
            fields: d.fields.as_ref(),
        }
    }

    fn write_failed(&mut self, e: StoreError) -> Error {
        // The stored aggregate is not the one decided on: never serve that one from memory again.
        self.slot.drop_aggregate();
        store_error(self.env.stats, e)
    }

    async fn committed(&mut self, revision: StoreRevision) -> Result<Self::Output, Error> {
        if let Some(Decided {
            fields: Some(fields),
            next: Some(next),
            ..
        }) = &self.attempt.decided
        {
            let changes: Vec<(String, Option<String>)> = fields
                .changes
                .iter()
                .map(|(name, json, _)| (name.clone(), json.clone()))
                .collect();
            let before = match (&self.attempt.loaded, fields.converts.is_empty()) {
                (Some((_, stored)), true) => stored.after(revision.0, &changes),
                _ => StoredFields::default().after(revision.0, &changes),
            };
            let mut memory = self.slot.cache.lock().expect("cache lock");
            memory.highest = memory.highest.max(next.metadata_version);
            memory.digest = group_fields::digest_hex(before.xor());
            memory.fields = Some(Arc::new(before));
            memory.aggregate = Some((revision, next.clone()));
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
