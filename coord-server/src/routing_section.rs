//! The critical sections without liveness: a stream's routing (created with a group, grown by add-shards) and
//! the creation of a group's metadata hash.

use protocol::metadata::{GroupMetadata, StreamRouting, MAX_SHARDS};
use protocol::names::{GroupName, StreamName};
use protocol::StoreRevision;

use crate::error::Error;
use crate::section::{unavailable, Section, Verdict};
use crate::state_machine;
use crate::stats::Stats;
use crate::store::{self, Loaded, SectionKeys, Store, Write};

/// What a routing decision asks for.
pub(crate) enum RoutingStep {
    /// Keep the stored routing (write nothing).
    Keep(StreamRouting),
    /// Write this routing.
    Write(StreamRouting),
}

/// The decision that ensures a stream's routing: an existing one must have `shard_count` shards (when given), a
/// missing one is created with them (and `lease_ms`) at Redis time.
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
    Ok(RoutingStep::Write(r))
}

/// The decision that grows a stream by `count` shards, at the stored revision `if_match` when given.
pub(crate) fn grow(
    stats: &Stats,
    loaded: &Loaded,
    stream: &StreamName,
    count: u32,
    if_match: Option<StoreRevision>,
) -> Result<RoutingStep, Error> {
    let Some(rev) = loaded.revision else {
        return Err(Error::MetadataUnavailable(format!("stream {stream} has no routing")));
    };
    check_if_match(if_match, rev)?;
    let current = decode(stats, loaded)?;
    if current.shard_count.saturating_add(count) > MAX_SHARDS {
        return Err(Error::InvalidRequest(format!(
            "a stream has at most {MAX_SHARDS} shards"
        )));
    }
    Ok(RoutingStep::Write(state_machine::add_shards(&current, count)))
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

/// A section over a stream's routing hash, deciding with `f` ([`ensure`], [`grow`]); the answer is the routing
/// kept or written, and the revision.
pub(crate) struct RoutingSection<F> {
    f: F,
    next: Option<(StreamRouting, String)>,
}

impl<F> RoutingSection<F>
where
    F: FnMut(&Loaded) -> Result<RoutingStep, Error>,
{
    pub fn new(f: F) -> Self {
        RoutingSection { f, next: None }
    }
}

impl<F> Section for RoutingSection<F>
where
    F: FnMut(&Loaded) -> Result<RoutingStep, Error>,
{
    type Output = (StreamRouting, StoreRevision);

    fn decide(&mut self, loaded: &Loaded) -> Result<Verdict<Self::Output>, Error> {
        match (self.f)(loaded)? {
            RoutingStep::Keep(current) => Ok(Verdict::Answer((current, loaded.revision.unwrap_or_default()))),
            RoutingStep::Write(next) => {
                let json = next.encode();
                self.next = Some((next, json));
                Ok(Verdict::Write)
            }
        }
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
    json: String,
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
            json: String::new(),
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
        self.json = (self.make)(loaded.now_ms).encode();
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
            aggregate: Some(&self.json),
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
