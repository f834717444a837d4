//! A token's group-create mutex: held across "count the token's groups, then create one", so concurrent creates
//! of one token never take it past its group quota, on one replica or several.
//!
//! Why a Redis mutex and not a local lock: the count is the groups index in Redis, and any replica may serve a
//! create; only a lock every replica sees orders their creates. Why not one Lua script that counts and registers:
//! a create writes the stream's routing, the group's hash and the index, in three different slots of a Cluster
//! (see `docs/cluster.md`), which no script can touch together; the mutex key stands alone in its own slot.
//!
//! The mutex is `SET key token NX PX mutex_ttl` (the group mutex's TTL), renewed every third of it by a task of the
//! holder while the create runs, and deleted by a compare-and-delete of the holder's token when done:
//! * a coordinator that dies holding it stops renewing, and the token's next create waits at most `mutex_ttl`
//!   for it to expire (other tokens never wait: the key names one token);
//! * a waiter gives up after `critical_section_timeout` with `STORE_UNAVAILABLE` (retryable), never with a
//!   quota refusal it could not know to be true;
//! * what it does not cover: a holder stalled longer than `mutex_ttl` (its renewals stop with it), or a failover
//!   of the metadata Redis that loses the key while it is held, lets one more create of that token count the
//!   groups before the first one's is indexed, and both may be created. The same two events can make two group
//!   sections overlap, where the revision compare-and-set decides; here nothing does, so the quota may then be
//!   passed by one.
//!
//! Only group creates and recreates take it: heartbeats, ticks and routing reads never do. A replica's own creates
//! of one token queue locally first ([`Store::quota_queue`]), so one of them at a time polls Redis.

use std::time::Duration;

use protocol::keys;
use tokio::sync::OwnedMutexGuard;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::coordinator::Coordinator;
use crate::error::{Error, StoreError};
use crate::quota::TokenQuota;
use crate::section::MutexWait;
use crate::store::{Store, Token};
use std::sync::atomic::Ordering;

/// A held group-create mutex of one token; [`QuotaLock::release`] frees it. Dropped without a release (a
/// panic, a cancelled task), it stops renewing and expires by its TTL.
pub(in crate::coordinator) struct QuotaLock {
    store: Store,
    key: String,
    token: Token,
    /// Renews the TTL while the create runs; aborted on release and on drop (it holds nothing to clean up).
    renewer: JoinHandle<()>,
    /// This process's turn in the token's local queue, given up after the mutex.
    _turn: OwnedMutexGuard<()>,
}

impl Coordinator {
    /// Takes `who`'s group-create mutex, waiting for it up to the critical-section timeout.
    ///
    /// # Errors
    /// [`StoreError::MutexBusy`] when another create of the token held it all that time; Redis errors.
    pub(in crate::coordinator) async fn take_quota_lock(&self, who: &TokenQuota) -> Result<QuotaLock, Error> {
        let (store, stats) = (&self.inner.store, &self.inner.stats);
        let ttl = self.inner.config.mutex_ttl;
        let key = keys::quota_mutex(&who.name);
        let limit = self.inner.config.critical_section_timeout;
        let started = Instant::now();
        let Ok(turn) = tokio::time::timeout(limit, store.quota_queue(&key).lock_owned()).await else {
            stats.mutex_timeouts.fetch_add(1, Ordering::Relaxed);
            let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Err(StoreError::MutexBusy { key, waited_ms }.into());
        };
        let token = store.token();
        let mut wait = MutexWait::new(limit.saturating_sub(started.elapsed()));
        loop {
            if store.try_take_quota_mutex(&key, &token, ttl).await? {
                stats.observe_mutex_wait(started.elapsed());
                let renewer = tokio::spawn(renew(store.clone(), key.clone(), token.to_string(), ttl));
                return Ok(QuotaLock {
                    store: store.clone(),
                    key,
                    token,
                    renewer,
                    _turn: turn,
                });
            }
            stats.mutex_busy.fetch_add(1, Ordering::Relaxed);
            let Some(pause) = wait.next_pause() else {
                stats.mutex_timeouts.fetch_add(1, Ordering::Relaxed);
                let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                return Err(StoreError::MutexBusy { key, waited_ms }.into());
            };
            tokio::time::sleep(pause).await;
        }
    }
}

impl QuotaLock {
    /// Frees the mutex (only while this lock still holds it). A failed release is logged: the mutex then
    /// expires by its TTL, and the token's next create waits for it at most that long.
    pub(in crate::coordinator) async fn release(self) {
        self.renewer.abort();
        if let Err(e) = self.store.release_quota_mutex(&self.key, &self.token).await {
            warn!(mutex = %self.key, error = %e, "quota mutex release failed; it expires by its TTL");
        }
    }
}

impl Drop for QuotaLock {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// Gives the mutex a fresh `ttl` every third of it, until aborted or until the mutex is no longer `token`'s.
async fn renew(store: Store, key: String, token: String, ttl: Duration) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        match store.renew_quota_mutex(&key, &token, ttl).await {
            Ok(true) => {}
            Ok(false) => {
                warn!(mutex = %key, "quota mutex lost while held (expired or taken over): the token's group quota \
                    may be passed by one");
                return;
            }
            // The next try may reach Redis again before the TTL runs out.
            Err(e) => warn!(mutex = %key, error = %e, "quota mutex renewal failed"),
        }
    }
}
