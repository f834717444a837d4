//! The round trips of a critical section on the store: take the mutex and load (`LOAD`), write with the revision
//! compare-and-set (`COMMIT`) or only free the mutex (`RELEASE`), and the snapshot reads without the mutex.

use protocol::keys::{fields, LAYOUT_VERSION};
use protocol::names::{MemberId, StreamName};
use protocol::StoreRevision;
use redis::Value;
use std::time::Duration;
use tracing::warn;

use super::decode::{
    check_of, check_versions, committed, corrupt, digest, int, parse_loaded, text, Fields, SNAPSHOT_FIELDS,
};
use super::section_data::{Cached, Committed, LivenessScope, Loaded, SectionKeys, Token, Write};
use super::Store;
use crate::error::StoreError;

impl Store {
    /// A new mutex token (32 hex digits: this store's owner id, then 64 random bits).
    pub fn token(&self) -> Token {
        let value = format!("{}{:016x}", self.owner, rand::random::<u64>());
        self.live.lock().expect("live tokens lock").insert(value.clone());
        Token {
            value,
            live: self.live.clone(),
        }
    }

    /// Whether `holder` is a mutex token of this store that no running section holds.
    fn is_stale_own(&self, holder: &str) -> bool {
        holder.len() == self.owner.len() + 16
            && holder.starts_with(&*self.owner)
            && !self.live.lock().expect("live tokens lock").contains(holder)
    }

    /// Tries to take the mutex and load; a stale mutex of this store is deleted and the load tried again once.
    /// `Ok(None)`: the mutex is busy.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a hash or liveness entry that does not parse (the mutex is then free), Redis
    /// errors and malformed replies.
    pub async fn try_load(
        &self,
        keys: &SectionKeys,
        token: &str,
        mutex_ttl: Duration,
        cached: Option<Cached<'_>>,
        scope: LivenessScope<'_>,
    ) -> Result<Option<Loaded>, StoreError> {
        let ask = Ask {
            keys,
            token,
            mutex_ttl,
            cached,
            scope,
        };
        for _ in 0..2 {
            match self.load_once(&ask).await? {
                Attempt::Loaded(loaded) => return Ok(Some(loaded)),
                Attempt::Busy(holder) if self.is_stale_own(&holder) => {
                    let mut conn = self.conn.clone();
                    let deleted: i64 = self
                        .release
                        .key(&keys.mutex)
                        .key(&keys.hash)
                        .arg(&holder)
                        .invoke_async(&mut conn)
                        .await?;
                    if deleted == 1 {
                        warn!(mutex = %keys.mutex, "deleted a stale mutex of this coordinator (failed section or \
                            Redis restart) instead of waiting for its TTL");
                    }
                }
                Attempt::Busy(_) => return Ok(None),
            }
        }
        Ok(None)
    }

    async fn load_once(&self, ask: &Ask<'_>) -> Result<Attempt, StoreError> {
        if ask.keys.fields {
            return self.load_group_once(ask).await;
        }
        let Ask {
            keys,
            token,
            mutex_ttl,
            cached,
            scope,
        } = *ask;
        let (scope_arg, members): (&str, Vec<&MemberId>) = match scope {
            LivenessScope::None => ("", Vec::new()),
            LivenessScope::Member(m) => ("m", vec![m]),
            LivenessScope::Members(ms) => ("m", ms.to_vec()),
            LivenessScope::All => ("*", Vec::new()),
        };
        let mut conn = self.conn.clone();
        let mut inv = self.load.key(&keys.hash);
        inv.key(&keys.liveness)
            .key(&keys.mutex)
            .arg(token)
            .arg(mutex_ttl.as_millis() as u64)
            .arg(cached.map(|c| c.revision.0.to_string()).unwrap_or_default())
            .arg(cached.map(|c| check_of(c, scope)).unwrap_or_default())
            .arg(keys.schema)
            .arg(LAYOUT_VERSION)
            .arg(scope_arg);
        for m in members {
            inv.arg(m.as_str());
        }
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        match int(&reply, 0)? {
            0 => return Ok(Attempt::Busy(text(&reply, 1)?)),
            2 => return Err(corrupt(keys, &text(&reply, 1)?)),
            _ => {}
        }
        match parse_loaded(&reply, keys) {
            Ok(mut loaded) => {
                if let (true, Some(c)) = (loaded.cache_hit, cached) {
                    loaded.aggregate_digest = c.digest.to_owned();
                }
                if loaded.run_id_changed() && self.nodes.is_some() {
                    self.explain_moved_run_id(keys, &mut loaded).await;
                }
                Ok(Attempt::Loaded(loaded))
            }
            Err(e) => {
                // The script checked every field already; a reply this build cannot parse must not leave the
                // group blocked for a mutex TTL either.
                self.release(keys, token).await?;
                Err(e)
            }
        }
    }

    /// On a cluster a stored run id other than the node's also follows a slot migration, which loses nothing: the
    /// keys moved whole. Told apart from a failover or restart by the stored run id still being a live master's
    /// (a replaced node's run id is nobody's, or a replica's). Then the node's run id is recorded
    /// ([`ADOPT_RUN_ID`]) and the load reports no change. Any doubt (an error, a master's run id unreadable)
    /// leaves the change reported: a needless correction round is safe, a missed one is not.
    pub(super) async fn explain_moved_run_id(&self, keys: &SectionKeys, loaded: &mut Loaded) {
        let masters = match self.master_run_ids().await {
            Ok(ids) => ids,
            Err(e) => {
                warn!(key = %keys.hash, error = %e, "cannot read the masters' run ids; treating the run id change \
                    as a possible loss");
                return;
            }
        };
        let Some(from) = masters
            .iter()
            .find(|(_, id)| *id == loaded.stored_run_id)
            .map(|(node, _)| node.clone())
        else {
            return;
        };
        let mut conn = self.conn.clone();
        let adopted: Result<i64, _> = self
            .adopt_run_id
            .key(&keys.hash)
            .arg(&loaded.stored_run_id)
            .arg(&loaded.run_id)
            .invoke_async(&mut conn)
            .await;
        match adopted {
            Ok(1) => {
                tracing::info!(key = %keys.hash, from = ?from, run_id = %loaded.run_id,
                    "metadata moved by a slot migration from a live master: not a loss; run id recorded");
                loaded.stored_run_id.clone_from(&loaded.run_id);
            }
            Ok(_) => {}
            Err(e) => warn!(key = %keys.hash, error = %e, "cannot record the run id after a slot migration"),
        }
    }

    /// Compare-and-set write, then releases the mutex (also on conflict and on a corrupt hash).
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when a field it would read or overwrite does not parse (nothing is written), Redis
    /// errors and malformed replies.
    pub async fn commit(
        &self,
        keys: &SectionKeys,
        token: &str,
        expected: Option<StoreRevision>,
        expected_liveness: u64,
        write: &Write<'_>,
    ) -> Result<Committed, StoreError> {
        if keys.fields {
            return self.commit_group(keys, token, expected, expected_liveness, write).await;
        }
        let mut conn = self.conn.clone();
        let mut inv = self.commit.key(&keys.hash);
        inv.key(&keys.liveness)
            .key(&keys.mutex)
            .arg(token)
            .arg(expected.map(|r| r.0.to_string()).unwrap_or_default())
            .arg(expected_liveness.to_string())
            .arg(write.aggregate.unwrap_or(""))
            .arg(keys.schema)
            .arg(LAYOUT_VERSION)
            .arg(write.now_ms)
            .arg(write.run_id)
            .arg(write.replaces)
            .arg(write.renew.len());
        for (m, lease) in write.renew {
            inv.arg(m.as_str()).arg(*lease);
        }
        for m in write.forget {
            inv.arg(m.as_str());
        }
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        committed(&reply, keys)
    }

    /// Releases the mutex if `token` still holds it.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn release(&self, keys: &SectionKeys, token: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .release
            .key(&keys.mutex)
            .key(&keys.hash)
            .arg(token)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Reads a hash without the mutex (a snapshot at one revision: the admin view, routing reads), with the
    /// liveness entries when `liveness` is set, and checks it as strictly as `LOAD` does.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a field that does not parse or a version this build does not understand; Redis
    /// errors.
    pub async fn read(&self, keys: &SectionKeys, liveness: bool) -> Result<Loaded, StoreError> {
        if keys.fields {
            return self.read_group(keys, liveness).await;
        }
        self.read_aggregate(keys, liveness, true).await
    }

    /// [`Store::read`] of a hash with one `aggregate`; with `clock` unset, no `TIME` is sent and the loaded
    /// clock is 0 (for reads that use only the document).
    async fn read_aggregate(&self, keys: &SectionKeys, liveness: bool, clock: bool) -> Result<Loaded, StoreError> {
        let mut conn = self.conn.clone();
        let mut fields: Vec<&str> = SNAPSHOT_FIELDS.to_vec();
        fields.push(fields::AGGREGATE);
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET").arg(&keys.hash).arg(&fields);
        if clock {
            pipe.cmd("TIME");
        }
        if liveness {
            pipe.cmd("HGETALL").arg(&keys.liveness);
        }
        let replies: Vec<Value> = pipe.query_async(&mut conn).await?;
        let raw = match replies.first() {
            Some(Value::Array(v)) => v.clone(),
            other => return Err(StoreError::Protocol(format!("HMGET replied {other:?}"))),
        };
        let at = |i: usize| text(&raw, i);
        let (secs, micros) = match (clock, replies.get(1)) {
            (false, _) => ("0".to_owned(), "0".to_owned()),
            (true, Some(Value::Array(t))) => (text(t, 0)?, text(t, 1)?),
            (true, other) => return Err(StoreError::Protocol(format!("TIME replied {other:?}"))),
        };
        let mut live = Vec::new();
        match replies.get(1 + usize::from(clock)) {
            Some(Value::Array(items)) => live.clone_from(items),
            Some(Value::Map(items)) => {
                for (k, v) in items {
                    live.push(k.clone());
                    live.push(v.clone());
                }
            }
            _ => {}
        }
        let revision = at(0)?;
        let aggregate = match raw.get(6) {
            Some(Value::BulkString(b)) => Some(b.clone()),
            _ => None,
        };
        let fields = Fields {
            revision: &revision,
            liveness_revision: &at(1)?,
            schema: &at(2)?,
            layout: &at(3)?,
            run_id: &at(4)?,
            updated_at: &at(5)?,
        };
        let mut loaded = fields.parse(keys, &secs, &micros, &live)?;
        if loaded.revision.is_some() {
            check_versions(&loaded, keys.schema).map_err(|e| corrupt(keys, &e))?;
        }
        if let Some(json) = &aggregate {
            loaded.aggregate_digest = digest(json);
        }
        loaded.aggregate = aggregate;
        Ok(loaded)
    }

    /// Reads a stream's routing without the mutex (routing reads are snapshots; writes go through the CAS).
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a hash that does not parse; Redis errors. A bad document is reported by the
    /// caller's decode.
    pub async fn read_routing(&self, stream: &StreamName) -> Result<Option<(StoreRevision, Vec<u8>)>, StoreError> {
        let loaded = self.read_aggregate(&SectionKeys::routing(stream), false, false).await?;
        Ok(match (loaded.revision, loaded.aggregate) {
            (Some(rev), Some(agg)) => Some((rev, agg)),
            _ => None,
        })
    }
}

/// What one load attempt asks of the load script (the arguments of [`Store::try_load`]).
#[derive(Clone, Copy)]
pub(super) struct Ask<'a> {
    pub(super) keys: &'a SectionKeys,
    pub(super) token: &'a str,
    pub(super) mutex_ttl: Duration,
    pub(super) cached: Option<Cached<'a>>,
    pub(super) scope: LivenessScope<'a>,
}

/// What one `LOAD` attempt found.
pub(super) enum Attempt {
    Loaded(Loaded),
    /// The mutex is held by this token.
    Busy(String),
}
