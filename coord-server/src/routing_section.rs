//! The critical sections without liveness: a stream's routing (created with a group, grown by add-shards) and
//! the creation of a group's metadata hash.

use protocol::metadata::{GroupMetadata, StreamRouting};
use protocol::names::{GroupName, StreamName};
use protocol::StoreRevision;

use crate::error::Error;
use crate::section::{Section, Verdict};
use crate::store::{Loaded, SectionKeys, Store, Write};

/// A section over a stream's routing hash. `f` returns the routing to write, or `None` to write nothing; the
/// answer is what was written (`None` when nothing was) and the revision.
pub(crate) struct RoutingSection<F> {
    f: F,
    next: Option<(StreamRouting, String)>,
}

impl<F> RoutingSection<F>
where
    F: FnMut(&Loaded) -> Result<Option<StreamRouting>, Error>,
{
    pub fn new(f: F) -> Self {
        RoutingSection { f, next: None }
    }
}

impl<F> Section for RoutingSection<F>
where
    F: FnMut(&Loaded) -> Result<Option<StreamRouting>, Error>,
{
    type Output = (Option<StreamRouting>, StoreRevision);

    fn decide(&mut self, loaded: &Loaded) -> Result<Verdict<Self::Output>, Error> {
        match (self.f)(loaded)? {
            None => Ok(Verdict::Answer((None, loaded.revision.unwrap_or_default()))),
            Some(next) => {
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
        Ok((Some(next), revision))
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
