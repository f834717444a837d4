//! The critical sections without liveness: a stream's routing (created with a group, grown by add-shards,
//! restored when Redis forgot part of it) and the creation of a group's metadata hash.
//!
//! # Ordering contract: the shards before the routing
//! A routing decision that adds shards writes the data plane first, under the routing mutex, and commits the
//! routing last ([`Prep`], in `before_write`): the parents' seals (fence raised, position recorded in the
//! parent's own record), then the children's records. A producer learns of a shard only from a committed routing,
//! so every shard it can write has its record, and a Redis that loses a suffix of these writes loses the routing
//! before the records and the records before the seals: what survives can always be restored upwards
//! ([`state_machine::routing`]).

use futures::{StreamExt, TryStreamExt};
use protocol::metadata::{GroupMetadata, StreamRouting, MAX_SHARDS};
use protocol::names::{GroupName, StreamName};
use protocol::reshard::{Birth, MAX_RECORDED_GROWTHS};
use protocol::{RoutingVersion, ShardId, StoreRevision};

use crate::error::Error;
use crate::quota::TokenQuota;
use crate::section::{unavailable, Section, Verdict};
use crate::state_machine;
use crate::state_machine::routing::{Evidence, Plan, Report, SealTodo, Why};
use crate::stats::Stats;
use crate::store::group_fields;
use crate::store::{self, FieldWrite, Loaded, SectionKeys, Store, Write};

/// Data-plane writes sent at once (seals, records): a growth of a large stream touches up to `MAX_SHARDS` keys.
const DATA_PLANE_IN_FLIGHT: usize = 64;

/// What a routing decision asks for.
pub(crate) enum RoutingStep {
    /// Keep the stored routing (write nothing).
    Keep(StreamRouting),
    /// Write this routing.
    Write(StreamRouting),
    /// Seal and record what [`Prep`] lists, then write the routing (with the seal positions filled in).
    Prepare(StreamRouting, Prep),
}

/// Data-plane writes a routing needs before it is committed (see the module docs).
#[derive(Debug, Default, Clone)]
pub(crate) struct Prep {
    /// Seals, oldest growth first.
    pub seals: Vec<SealTodo>,
    /// Shard records to write (an existing record is kept).
    pub records: Vec<Birth>,
}

/// What the section read of the shards, under the routing mutex, for a decision that asked for it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Probed {
    /// Records from the stored shard count on, consecutive.
    pub beyond: Vec<Birth>,
    /// Shard 0's fence (a parent of every growth).
    pub fence: RoutingVersion,
    /// The shard keys from the stored count up to this one (exclusive) hold entries (see
    /// [`state_machine::routing::Evidence::entries_end`]).
    pub entries_end: u32,
}

impl Probed {
    /// The evidence these reads and `loaded` give, with a client's `report`.
    pub fn evidence(&self, loaded: &Loaded, report: Option<Report>) -> Evidence {
        Evidence {
            report,
            beyond: self.beyond.clone(),
            fence: self.fence,
            entries_end: self.entries_end,
            run_id_changed: loaded.run_id_changed(),
            now_ms: loaded.now_ms,
        }
    }
}

/// Reads the shards' evidence of a routing of `shard_count` shards: shard 0's fence and the records from
/// `shard_count` on until one is missing; past that one, when shard 0's `fenceCount` says a layout with more
/// shards sealed it, the last record of each growth up to that count, walking back from it (see
/// [`state_machine::routing::plan`]); and the shard keys from `shard_count` on that hold entries, up to one past
/// `ceiling` (enough to refuse a restoration above it, never a walk a writer of stray keys could make long).
///
/// # Errors
/// A Redis failure; a record that does not parse.
pub(crate) async fn probe(store: &Store, stream: &StreamName, shard_count: u32, ceiling: u32) -> Result<Probed, Error> {
    let mut conn = store.data().connection();
    let (fence, sealed_for) = store::reshard::fence_and_count(&mut conn, stream, ShardId(0)).await?;
    let mut beyond = Vec::new();
    let mut next = shard_count;
    // Usually none: one read says so. A lost growth is read in batches.
    let mut batch = 1u32;
    let mut gap = None;
    while next < MAX_SHARDS {
        let end = next.saturating_add(batch).min(MAX_SHARDS);
        let found = births(&conn, stream, next..end).await?;
        let missing = found.iter().position(Option::is_none);
        beyond.extend(found.into_iter().flatten().take(missing.unwrap_or(usize::MAX)));
        if let Some(m) = missing {
            gap = Some(next + m as u32);
            break;
        }
        next = end;
        batch = (batch * 4).min(DATA_PLANE_IN_FLIGHT as u32 * 4);
    }
    if let Some(m) = gap {
        // Rare (a layout that sealed shard 0 has more shards than the records show): one read per lost growth,
        // from that layout's last shard back (`state_machine::routing::first_past_gap`).
        let mut past = Vec::new();
        let mut next = state_machine::routing::first_past_gap(m, sealed_for);
        while let Some(shard) = next.filter(|_| past.len() <= MAX_RECORDED_GROWTHS) {
            let found = store::reshard::birth(&mut conn, stream, ShardId(shard)).await?;
            next = found.and_then(|b| state_machine::routing::next_past_gap(m, &b));
            past.extend(found);
        }
        beyond.extend(past.into_iter().rev());
    }
    let entries_end = entries_end(&conn, stream, shard_count, ceiling.saturating_add(1).min(MAX_SHARDS)).await?;
    Ok(Probed {
        beyond,
        fence,
        entries_end,
    })
}

/// The end of the run of shard keys from `from` on that hold entries, read up to `limit` (exclusive), in batches
/// like the records: usually one `XLEN` says there is none.
async fn entries_end(conn: &redis_link::Connection, stream: &StreamName, from: u32, limit: u32) -> Result<u32, Error> {
    let mut next = from;
    let mut batch = 1u32;
    while next < limit {
        let end = next.saturating_add(batch).min(limit);
        let held: Vec<bool> = futures::stream::iter(next..end)
            .map(|shard| {
                let mut conn = conn.clone();
                async move { store::reshard::holds_entries(&mut conn, stream, ShardId(shard)).await }
            })
            .buffered(DATA_PLANE_IN_FLIGHT)
            .try_collect()
            .await?;
        if let Some(empty) = held.iter().position(|h| !h) {
            return Ok(next + empty as u32);
        }
        next = end;
        batch = (batch * 4).min(DATA_PLANE_IN_FLIGHT as u32 * 4);
    }
    Ok(next)
}

/// The records of `shards` (`None`: no record), `DATA_PLANE_IN_FLIGHT` reads at a time.
async fn births(
    conn: &redis_link::Connection,
    stream: &StreamName,
    shards: std::ops::Range<u32>,
) -> Result<Vec<Option<Birth>>, Error> {
    Ok(futures::stream::iter(shards)
        .map(|shard| {
            let mut conn = conn.clone();
            async move { store::reshard::birth(&mut conn, stream, ShardId(shard)).await }
        })
        .buffered(DATA_PLANE_IN_FLIGHT)
        .try_collect()
        .await?)
}

/// The records every shard of `routing` must have, for a routing written before shard records existed: each
/// shard's birth as the recorded growths tell it (`1` and no parents for the shards a stream started with, or
/// grew to before the oldest growth it remembers).
///
/// Each record's `bornCount` is the growth's shard count; for the shards before the oldest remembered growth it
/// is that growth's parents (the stream had at least as many shards then), or the stream's count without growths.
pub(crate) fn migration_records(routing: &StreamRouting) -> Vec<Birth> {
    let first = routing.growths.first().map_or(routing.shard_count, |g| g.parents);
    (0..routing.shard_count)
        .map(|shard| {
            let g = routing
                .growths
                .iter()
                .find(|g| shard >= g.parents && shard < g.shard_count);
            Birth {
                shard: ShardId(shard),
                born: g.map_or(RoutingVersion(1), |g| g.routing_version),
                parents: g.map_or(0, |g| g.parents),
                count: g.map_or(first, |g| g.shard_count),
            }
        })
        .collect()
}

/// The restoration a probe calls for (see [`state_machine::routing::plan`]; `report`, the client's report that
/// prompted it if one did, is a hint and never evidence) and why, and the records a routing written before shard
/// records existed still needs. `Keep` when neither.
///
/// # Errors
/// [`Error::MetadataUnavailable`] for a routing that is missing or unreadable, and for a plan above `ceiling`
/// shards (nothing is written: see `docs/runbooks/routing-regressed.md`).
pub(crate) fn restore(
    stats: &Stats,
    loaded: &Loaded,
    probed: &Probed,
    report: Option<Report>,
    ceiling: u32,
) -> Result<(RoutingStep, Vec<Why>), Error> {
    if loaded.revision.is_none() {
        return Err(Error::MetadataUnavailable("the stream has no routing".into()));
    }
    let current = decode(stats, loaded)?;
    let evidence = probed.evidence(loaded, report);
    let (mut next, mut prep, why) = match state_machine::routing::plan(&current, &evidence) {
        Some(plan) if plan.next.shard_count > ceiling.max(current.shard_count) => {
            // Redis holds evidence of more shards than any token may grow this stream to: stray keys or records
            // (a writer with Redis access, a foreign tool), not a growth a coordinator made. Fail closed and write
            // nothing; docs/runbooks/routing-regressed.md says what to look at.
            stats.metrics().routing_restore_refused();
            return Err(Error::MetadataUnavailable(format!(
                "stream {}: Redis holds evidence of {} shards ({:?}), above the stream's ceiling of {ceiling}; \
                 nothing was restored (runbook: docs/runbooks/routing-regressed.md)",
                current.stream, plan.next.shard_count, plan.why
            )));
        }
        Some(Plan {
            next,
            seals,
            records,
            why,
        }) => (next, Prep { seals, records }, why),
        None if current.shard_records => return Ok((RoutingStep::Keep(current), Vec::new())),
        None => (current.clone(), Prep::default(), Vec::new()),
    };
    if !current.shard_records {
        prep.records.splice(0..0, migration_records(&current));
        next.shard_records = true;
        if why.is_empty() {
            // As a new routing: reports are evidence only after a loss the coordinator saw.
            next.reports_settled = true;
        }
    }
    Ok((RoutingStep::Prepare(next, prep), why))
}

/// The decision that ensures a stream's routing: an existing one must have `shard_count` shards (when given), a
/// missing one is created with them (and `lease_ms`) at Redis time, after the records of its shards.
pub(crate) fn ensure(
    stats: &Stats,
    loaded: &Loaded,
    stream: &StreamName,
    shard_count: Option<u32>,
    lease_ms: u64,
) -> Result<RoutingStep, Error> {
    if loaded.revision.is_some() {
        let current = decode(stats, loaded)?;
        if shard_count.is_some_and(|n| n != current.shard_count) {
            return Err(Error::InvalidRequest(format!(
                "stream {stream} has {} shards; use the add-shards endpoint to grow it",
                current.shard_count
            )));
        }
        return Ok(RoutingStep::Keep(current));
    }
    let Some(n) = shard_count else {
        return Err(Error::InvalidRequest(format!(
            "stream {stream} is new: shardCount is required"
        )));
    };
    let mut r = StreamRouting::new(stream.clone(), n, loaded.now_ms);
    r.routing_lease_ms = lease_ms;
    r.shard_records = true;
    // Nothing of a new routing was lost: a client's report is evidence only after the coordinator saw this
    // routing's Redis change (a new run id), never before (a hostile report would grow the stream).
    r.reports_settled = true;
    let prep = Prep {
        seals: Vec::new(),
        records: migration_records(&r),
    };
    Ok(RoutingStep::Prepare(r, prep))
}

/// An add-shards as [`grow`] decides it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrowRequest<'a> {
    /// Shards to add.
    pub count: u32,
    /// The stored revision the admin expects (`If-Match`).
    pub if_match: Option<StoreRevision>,
    /// The stream's growth ceiling, which no restoration the growth starts from may pass (see [`restore`]).
    pub ceiling: u32,
    /// The requesting token's shard limit; `None`: no limit.
    pub quota: Option<&'a TokenQuota>,
}

/// The decision that grows a stream by `req.count` shards, at the stored revision `req.if_match` when given, from
/// the routing as restored first (a growth Redis lost is restored as it was, never recreated over its records,
/// and never past `req.ceiling`), with its parents sealed and its children recorded before it is committed. After
/// a loss of the routing hash (a new run id) the version skips past every number the lost history may have
/// issued. A growth past `req.quota`'s shard limit is refused here, under the routing mutex, so the count checked
/// is the count grown.
pub(crate) fn grow(
    stats: &Stats,
    loaded: &Loaded,
    probed: &Probed,
    stream: &StreamName,
    req: GrowRequest<'_>,
) -> Result<RoutingStep, Error> {
    let GrowRequest {
        count,
        if_match,
        ceiling,
        quota,
    } = req;
    let Some(rev) = loaded.revision else {
        return Err(Error::MetadataUnavailable(format!("stream {stream} has no routing")));
    };
    check_if_match(if_match, rev)?;
    let (base, mut prep) = match restore(stats, loaded, probed, None, ceiling)?.0 {
        RoutingStep::Keep(r) | RoutingStep::Write(r) => (r, Prep::default()),
        RoutingStep::Prepare(r, prep) => (r, prep),
    };
    if base.shard_count.saturating_add(count) > MAX_SHARDS {
        return Err(Error::InvalidRequest(format!(
            "a stream has at most {MAX_SHARDS} shards"
        )));
    }
    if let Some(q) = quota {
        q.check_growth(stats, stream, base.shard_count, count)?;
    }
    let mut next = state_machine::add_shards(&base, count);
    if loaded.run_id_changed() && base.routing_version == decode(stats, loaded)?.routing_version {
        let v = state_machine::routing::retired(base.routing_version, probed.fence, loaded.now_ms);
        next.routing_version = v;
        if let Some(g) = next.growths.last_mut() {
            g.routing_version = v;
        }
        next.reports_settled = false;
    }
    let g = next.growths.last().expect("add_shards records the growth").clone();
    prep.seals.extend((0..g.parents).map(|p| SealTodo {
        version: g.routing_version,
        shard: ShardId(p),
        reuse: None,
        count: g.shard_count,
    }));
    prep.records.extend((g.parents..g.shard_count).map(|c| Birth {
        shard: ShardId(c),
        born: g.routing_version,
        parents: g.parents,
        count: g.shard_count,
    }));
    Ok(RoutingStep::Prepare(next, prep))
}

/// The decision that records the seal positions the seal script returned (see [`state_machine::reshard`]);
/// `fallback` is kept when the routing hash is gone (nothing to record into).
pub(crate) fn record_seals(
    stats: &Stats,
    loaded: &Loaded,
    seals: &[state_machine::reshard::Seal],
    fallback: &StreamRouting,
) -> Result<RoutingStep, Error> {
    if loaded.revision.is_none() {
        return Ok(RoutingStep::Keep(fallback.clone()));
    }
    let current = decode(stats, loaded)?;
    Ok(match state_machine::reshard::record_seals(&current, seals) {
        Some(next) => RoutingStep::Write(next),
        None => RoutingStep::Keep(current),
    })
}

/// An admin `If-Match` against the stored revision.
pub(crate) fn check_if_match(if_match: Option<StoreRevision>, stored: StoreRevision) -> Result<(), Error> {
    match if_match {
        Some(expected) if expected != stored => Err(Error::RevisionConflict {
            expected,
            found: stored,
        }),
        _ => Ok(()),
    }
}

/// The loaded routing document.
fn decode(stats: &Stats, loaded: &Loaded) -> Result<StreamRouting, Error> {
    store::check_versions(loaded, store::schema_of_routing()).map_err(|e| unavailable(stats, e))?;
    let json = loaded.aggregate.as_deref().unwrap_or_default();
    store::decode_routing(json).map_err(|e| unavailable(stats, e))
}

/// A section over a stream's routing hash, deciding with `f` ([`ensure`], [`grow`], [`restore`]); the answer is
/// the routing kept or written, and the revision.
pub(crate) struct RoutingSection<'a, F> {
    f: F,
    /// Set when the decision needs the shards' evidence (read in `check`, under the mutex), with the stream's
    /// growth ceiling (see [`probe`]).
    probe: Option<(&'a StreamName, u32)>,
    probed: Probed,
    prep: Prep,
    next: Option<(StreamRouting, String)>,
}

impl<'a, F> RoutingSection<'a, F>
where
    F: FnMut(&Loaded, &Probed) -> Result<RoutingStep, Error>,
{
    pub fn new(f: F) -> Self {
        RoutingSection {
            f,
            probe: None,
            probed: Probed::default(),
            prep: Prep::default(),
            next: None,
        }
    }

    /// Reads the shards' evidence of `stream` ([`probe`], up to one past `ceiling` shards) before every decision.
    pub fn probing(mut self, stream: &'a StreamName, ceiling: u32) -> Self {
        self.probe = Some((stream, ceiling));
        self
    }
}

impl<F> Section for RoutingSection<'_, F>
where
    F: FnMut(&Loaded, &Probed) -> Result<RoutingStep, Error>,
{
    type Output = (StreamRouting, StoreRevision);

    async fn check(&mut self, store: &Store, _keys: &SectionKeys, loaded: &Loaded) -> Result<(), Error> {
        self.probed = Probed::default();
        if let (Some((stream, ceiling)), Some(json)) = (self.probe, loaded.aggregate.as_deref()) {
            // A routing that does not decode is refused by the decision itself.
            if let Ok(current) = store::decode_routing(json) {
                self.probed = probe(store, stream, current.shard_count, ceiling).await?;
            }
        }
        Ok(())
    }

    fn decide(&mut self, loaded: &Loaded) -> Result<Verdict<Self::Output>, Error> {
        match (self.f)(loaded, &self.probed)? {
            RoutingStep::Keep(current) => Ok(Verdict::Answer((current, loaded.revision.unwrap_or_default()))),
            RoutingStep::Write(next) => {
                let json = next.encode();
                self.prep = Prep::default();
                self.next = Some((next, json));
                Ok(Verdict::Write)
            }
            RoutingStep::Prepare(next, prep) => {
                let json = next.encode();
                self.prep = prep;
                self.next = Some((next, json));
                Ok(Verdict::Write)
            }
        }
    }

    async fn before_write(&mut self, store: &Store, _keys: &SectionKeys) -> Result<(), Error> {
        let prep = std::mem::take(&mut self.prep);
        if prep.seals.is_empty() && prep.records.is_empty() {
            return Ok(());
        }
        let (next, json) = self.next.as_mut().expect("decided before the write");
        let stream = next.stream.clone();
        let conn = store.data().connection();
        // Seals first: a child's record exists only once every parent refuses the layout without it.
        let sealed: Vec<(SealTodo, protocol::reshard::EntryId)> = futures::stream::iter(prep.seals)
            .map(|todo| {
                let mut conn = conn.clone();
                let stream = &stream;
                async move {
                    let s = store::reshard::seal_reusing(
                        &mut conn,
                        stream,
                        todo.shard,
                        todo.version,
                        todo.count,
                        todo.reuse,
                    )
                    .await?;
                    Ok::<_, Error>((todo, s.position))
                }
            })
            .buffered(DATA_PLANE_IN_FLIGHT)
            .try_collect()
            .await?;
        for (todo, position) in sealed {
            if let Some(g) = next.growths.iter_mut().find(|g| g.routing_version == todo.version) {
                if todo.shard.0 < g.parents {
                    g.seals.entry(todo.shard).or_insert(position);
                }
            }
        }
        futures::stream::iter(prep.records)
            .map(|birth| {
                let mut conn = conn.clone();
                let stream = &stream;
                async move { store::reshard::record(&mut conn, stream, birth).await.map(|_| ()) }
            })
            .buffered(DATA_PLANE_IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await?;
        *json = next.encode();
        Ok(())
    }

    fn write<'a>(&'a self, loaded: &'a Loaded) -> Write<'a> {
        let (_, json) = self.next.as_ref().expect("decided before the write");
        Write {
            aggregate: Some(json),
            replaces: &loaded.aggregate_digest,
            now_ms: loaded.now_ms,
            run_id: &loaded.run_id,
            ..Write::default()
        }
    }

    async fn committed(&mut self, revision: StoreRevision) -> Result<Self::Output, Error> {
        let (next, _) = self.next.take().expect("decided before the write");
        Ok((next, revision))
    }
}

/// The creation of a group's metadata hash: `make` builds the metadata from Redis time. A hash in any form (even
/// without a revision: damaged) is never overwritten, and a lost race is an `ALREADY_EXISTS`, not a retry.
pub(crate) struct CreateSection<'a, M> {
    stream: &'a StreamName,
    group: &'a GroupName,
    make: M,
    fields: FieldWrite,
}

impl<'a, M> CreateSection<'a, M>
where
    M: FnMut(u64) -> GroupMetadata,
{
    pub fn new(stream: &'a StreamName, group: &'a GroupName, make: M) -> Self {
        CreateSection {
            stream,
            group,
            make,
            fields: FieldWrite::default(),
        }
    }

    fn exists_error(&self) -> Error {
        Error::AlreadyExists(format!(
            "group {} of stream {} has a metadata hash",
            self.group, self.stream
        ))
    }
}

impl<M> Section for CreateSection<'_, M>
where
    M: FnMut(u64) -> GroupMetadata,
{
    type Output = StoreRevision;

    async fn check(&mut self, store: &Store, keys: &SectionKeys, loaded: &Loaded) -> Result<(), Error> {
        // A hash without a revision is damaged, not absent.
        if loaded.revision.is_some() || store.hash_exists(keys).await? {
            return Err(self.exists_error());
        }
        Ok(())
    }

    fn decide(&mut self, loaded: &Loaded) -> Result<Verdict<Self::Output>, Error> {
        let meta = (self.make)(loaded.now_ms);
        self.fields.changes = group_fields::all_fields(&meta)
            .into_iter()
            .map(|(name, json)| (name, Some(json), String::new()))
            .collect();
        Ok(Verdict::Write)
    }

    async fn before_write(&mut self, store: &Store, keys: &SectionKeys) -> Result<(), Error> {
        // The liveness hash of a lost group may survive it: its entries name members the new group does not have
        // and are ignored; clear them so they cannot lengthen a future member's lease.
        store.clear_liveness(keys).await?;
        Ok(())
    }

    fn write<'a>(&'a self, loaded: &'a Loaded) -> Write<'a> {
        Write {
            fields: Some(&self.fields),
            now_ms: loaded.now_ms,
            run_id: &loaded.run_id,
            ..Write::default()
        }
    }

    async fn committed(&mut self, revision: StoreRevision) -> Result<Self::Output, Error> {
        Ok(revision)
    }

    fn conflict(&mut self) -> Result<(), Error> {
        Err(Error::AlreadyExists(format!(
            "group {} of stream {} was created concurrently",
            self.group, self.stream
        )))
    }
}
