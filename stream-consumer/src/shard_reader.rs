//! One shard's reader: a task that reads one shard stream and hands its entries, in order, to the handler.
//!
//! # Redis layout
//! * Redis consumer group on the shard stream ([`keys::shard_stream`]) = the coordinator group name; created
//!   with `XGROUP CREATE ... MKSTREAM` when missing, at the configured [`StartPosition`](crate::StartPosition).
//! * Redis consumer name = the member id.
//! * A dedicated connection per reader for the blocking `XREADGROUP` (a blocking call would stall every other
//!   command on a shared multiplexed connection), with a response timeout longer than `BLOCK`; the consumer's
//!   shared [`ConnectionManager`] for everything that does not block (`XACK`, `XAUTOCLAIM`, `XCLAIM`,
//!   `XPENDING`, `XGROUP`, dead-lettering).
//!
//! # Order of work
//! 1. `on_assigned` callback.
//! 2. Make sure the group exists.
//! 3. Re-deliver what earlier owners left pending: `XAUTOCLAIM` from `0-0` with min-idle 0, following the cursor
//!    to the end. Idle 0 is safe: the coordinator only assigns a shard once its previous owner reported it
//!    revoked, expired, or was fenced and its lease ended, so nobody else is working on those entries.
//! 4. New entries: `XREADGROUP ... BLOCK <read_block> STREAMS key >`. After a failed read the dedicated
//!    connection is dropped and reopened with backoff, and step 3 runs again first: Redis may have delivered
//!    entries to a read whose reply was lost with the connection, and `>` never returns those again.
//! 5. After every read returns, and before every entry, check the shard is still ours (not revoking, lease
//!    valid). Entries read but not handled stay pending for this member; whoever owns the shard next claims
//!    them in step 3.
//! 6. When told to stop (DRAIN, close): finish the entry in hand, then `on_revoked`, then exit. A blocking read
//!    in progress is abandoned at once and its connection closed, which ends it on the server before the shard
//!    is reported revoked (not `CLIENT UNBLOCK`, which an ACL cannot confine to a tenant's own connections: see
//!    `dedicated.rs`).
//!
//! # Handling one entry
//! The handler succeeds: the entry is acknowledged. Acknowledgements are batched (one `XACK` per read instead of
//! one round trip per entry): one `XACK` carrying every entry handled since the last one, sent with the next
//! read (same connection, same round trip, its answer awaited separately), at the end of a claim batch, before
//! a retry pause, before the reader stops or waits for its lease, and, within a read, as soon as an entry
//! finishes [`ack_batch::ACK_WINDOW`] or more after the oldest unacknowledged success. Until its answer the entry counts as
//! in flight. The `XACK` is retried until it succeeds while the shard is ours (an entry left pending under this
//! member would not be delivered again while it keeps the shard); a killed reader tries once, briefly. A crash
//! can thus re-deliver up to one read's handled entries (at most `batch_size`), where one-ack-per-entry
//! re-delivered at most one: delivery stays at-least-once.
//!
//! It fails (or panics): the entry stays pending and is retried in place after a jittered exponential backoff;
//! each retry is recorded as a delivery in Redis (`XCLAIM` to this member, which increments the delivery count)
//! so the count survives a crash. An entry whose delivery count exceeds `max_deliveries` goes to the dead-letter
//! stream (see [`crate::dead_letter`]).
//!
//! # Layout
//! This file is the task: what it waits for, sends and retries; [`dedicated`] holds its own connection for the
//! blocking read (where it goes, the read, abandoning it on a stop). What can be decided without I/O is in the
//! submodules: [`ack_batch`] (which entries the next `XACK` carries, and when it must go out), [`retry`]
//! (acknowledge, dead-letter, or retry after which delay), [`commands`] (every Redis command the reader sends,
//! and the pairing of a claim batch with its delivery counts) and [`health`] (how long the reader has failed to
//! reach Redis).

mod ack_batch;
mod commands;
mod dedicated;
mod health;
mod reader;
mod retry;

use futures::FutureExt;
use protocol::keys;
use protocol::{FencingToken, ShardId};
use redis::{RedisError, Value};
use redis_link::{KeyRoute, Redirect};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::dead_letter;
use crate::in_flight::{InFlight, InFlightGuard};
use crate::lease::{now, LeaseExpired, UnderLease};
use crate::message::{EntryId, Message};
use crate::stream_reply::{self, RawEntry};
use ack_batch::AckBatch;
use commands::{with_delivery_counts, ShardCommands};
pub(crate) use health::ReadHealth;
pub(crate) use reader::ReaderShared;
use reader::{reply_error, Reader};
use retry::{jittered, Decision, Retries};

/// How a reader is told to stop.
#[derive(Debug, Clone)]
pub(crate) struct ReaderControl {
    /// Stop new reads, finish the entry in hand (DRAIN, close).
    pub stop: CancellationToken,
    /// Drop everything now, in-flight handler included (fenced, lease expired, drain deadline, abort).
    pub kill: CancellationToken,
}

/// How a reader ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReaderExit {
    /// Stopped in an orderly way: nothing in flight, `on_revoked` called.
    Drained,
    /// Killed: in-flight work was dropped.
    Killed,
}

/// Runs the reader of `shard` until it is stopped or killed.
///
/// # Cancel safety
/// Not meant to be dropped: stop it through `ctl`. Dropping it is like a crash (entries in hand stay pending).
pub(crate) async fn run(
    shared: Arc<ReaderShared>,
    shard: ShardId,
    fencing_token: FencingToken,
    ctl: ReaderControl,
    in_flight: Arc<InFlight>,
    health: Arc<ReadHealth>,
) -> ReaderExit {
    let route = KeyRoute::new(keys::shard_stream(&shared.stream, shard));
    let mut reader = Reader {
        stream: Arc::new(shared.stream.clone()),
        cmds: ShardCommands::new(
            keys::shard_stream(&shared.stream, shard),
            keys::dead_letter_stream(&shared.stream, shard),
            shared.group.clone(),
            shared.member_id.clone(),
        ),
        shared,
        shard,
        fencing_token,
        stop: ctl.stop,
        in_flight,
        health,
        failing: false,
        dedicated: None,
        route,
        redirects: 0,
        redis_backoff: None,
        acks: AckBatch::default(),
        last_claim: now(),
    };
    let exit = tokio::select! {
        biased;
        _ = ctl.kill.cancelled() => ReaderExit::Killed,
        () = reader.body() => ReaderExit::Drained,
    };
    if exit == ReaderExit::Killed {
        // The body was dropped mid-way; closing its connection ends a read still blocked in XREADGROUP.
        reader.dedicated = None;
        // Entries handled but not yet acknowledged: one brief try; if it fails they are delivered again.
        if !reader.acks.is_empty() && reader.within_lease() {
            let _ = tokio::time::timeout(Duration::from_millis(500), reader.send_acks()).await;
            reader.acks.clear();
        }
    }
    debug!(shard = %shard, ?exit, "shard reader stopped");
    exit
}

fn is_nogroup(e: &RedisError) -> bool {
    e.code() == Some("NOGROUP")
}

impl Reader {
    async fn body(&mut self) {
        let assigned = self.shared.listener.on_assigned(self.shard, self.fencing_token);
        self.bounded_callback("on_assigned", assigned).await;
        if self.ensure_group().await {
            // Claim, then read new entries; after a failed read, claim again: Redis may have delivered entries
            // to a read whose reply was lost with the connection, and `>` never returns them again.
            while self.claim_pending().await && self.read_new().await {}
        }
        self.flush_acks().await;
        self.dedicated = None;
        let revoked = self.shared.listener.on_revoked(self.shard);
        self.bounded_callback("on_revoked", revoked).await;
    }

    /// Runs a rebalance callback under the lease, like the handler (dropped at its first poll past the lease end),
    /// and for at most `listener_timeout` (a lease that keeps being renewed must not let it hold the shard).
    async fn bounded_callback(&self, name: &str, callback: futures::future::BoxFuture<'_, ()>) {
        let under_lease = UnderLease::new(&self.shared.lease, callback);
        match tokio::time::timeout(self.shared.listener_timeout, under_lease).await {
            Ok(Ok(())) => {}
            Ok(Err(LeaseExpired)) => {
                warn!(shard = %self.shard, "assignment lease ran out during {name}; callback dropped");
            }
            Err(_) => warn!(shard = %self.shard, timeout = ?self.shared.listener_timeout,
                "{name} ran past listener_timeout; callback dropped"),
        }
    }

    /// Whether the shard may still be read or handled: not revoking and within the lease.
    fn may_handle(&self) -> bool {
        !self.stop.is_cancelled() && self.shared.lease.is_valid_at(now())
    }

    /// Whether anything may still be sent to Redis for this shard (acknowledgements, claims, dead letters,
    /// retries): only within the lease. Checked immediately before every such command, with no `.await` between
    /// the check and the send, so that after a stall nothing goes out for a shard someone else may own by now.
    fn within_lease(&self) -> bool {
        self.shared.lease.is_valid()
    }

    /// Sleeps `d`, or returns `false` at once when stopped.
    async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// After a Redis error: waits with backoff. `false` when stopped meanwhile.
    async fn redis_failed(&mut self, what: &str, e: &RedisError) -> bool {
        let (min, max) = (Duration::from_millis(50), Duration::from_secs(2));
        let delay = self
            .redis_backoff
            .get_or_insert_with(|| jittered(min, max))
            .next()
            .unwrap_or(max);
        if !self.failing {
            self.failing = true;
            self.health.set(Some(now()));
        }
        warn!(shard = %self.shard, group = %self.shared.group, error = %e, retry_in = ?delay, "{what} failed");
        self.pause(delay).await
    }

    fn redis_ok(&mut self) {
        self.redis_backoff = None;
        if self.failing {
            self.failing = false;
            self.health.set(None);
        }
    }

    /// Waits while the lease is not valid (the heartbeat loop is about to stop this reader). `false` when stopped.
    async fn wait_for_lease(&self) -> bool {
        while !self.shared.lease.is_valid_at(now()) {
            if !self.pause(Duration::from_millis(20)).await {
                return false;
            }
        }
        !self.stop.is_cancelled()
    }

    /// Creates the Redis consumer group if missing. `false` when stopped before it succeeded.
    async fn ensure_group(&mut self) -> bool {
        loop {
            if self.stop.is_cancelled() {
                return false;
            }
            let mut conn = self.shared.conn.clone();
            let r: Result<Value, RedisError> = self
                .cmds
                .create_group(self.shared.start_from.group_create_id())
                .query_async(&mut conn)
                .await;
            match r {
                Ok(_) => {
                    debug!(shard = %self.shard, key = %self.cmds.key, "created the consumer group");
                    self.redis_ok();
                    return true;
                }
                Err(e) if e.code() == Some("BUSYGROUP") => {
                    self.redis_ok();
                    return true;
                }
                Err(e) => {
                    if !self.redis_failed("XGROUP CREATE", &e).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Step 3: re-delivers the group's pending entries (any consumer's) from the start, following the cursor.
    /// Returns `false` when stopped.
    async fn claim_pending(&mut self) -> bool {
        // Entries handled but whose acknowledgement was lost with a failed read must not be claimed again.
        self.flush_acks().await;
        let mut cursor = "0-0".to_owned();
        loop {
            if !self.wait_for_lease().await {
                return false;
            }
            // `wait_for_lease` returned without awaiting when the lease is valid: the check above is immediately
            // before the XAUTOCLAIM goes out (see `within_lease`).
            let batch = match self.claim_batch(&cursor).await {
                Ok(b) => b,
                Err(e) => {
                    if is_nogroup(&e) {
                        // The stream or group vanished (Redis restarted empty, key deleted): nothing is pending.
                        if !self.ensure_group().await {
                            return false;
                        }
                        continue;
                    }
                    if !self.redis_failed("XAUTOCLAIM", &e).await {
                        return false;
                    }
                    continue;
                }
            };
            self.redis_ok();
            let (next, entries) = batch;
            for (entry, count) in entries {
                if !self.may_handle() {
                    // Claimed to this member and left pending: the shard's next owner claims it again.
                    self.flush_acks().await;
                    return !self.stop.is_cancelled();
                }
                self.handle(entry, count).await;
            }
            self.flush_acks().await;
            if next == "0-0" {
                self.last_claim = now();
                return true;
            }
            cursor = next;
        }
    }

    /// One `XAUTOCLAIM` batch, with the delivery count of each claimed entry (from `XPENDING`).
    async fn claim_batch(&mut self, cursor: &str) -> Result<(String, Vec<(RawEntry, u32)>), RedisError> {
        let mut conn = self.shared.conn.clone();
        let reply: Value = self
            .cmds
            .auto_claim(cursor, self.shared.batch_size)
            .query_async(&mut conn)
            .await?;
        let claim = stream_reply::auto_claim(reply).map_err(reply_error)?;
        if !claim.deleted.is_empty() {
            debug!(shard = %self.shard, deleted = claim.deleted.len(), "pending entries no longer in the stream");
        }
        let entries: Vec<RawEntry> = claim.entries;
        let counts = match (entries.first(), entries.last()) {
            (Some(first), Some(last)) => self.delivery_counts(first.id, last.id, entries.len()).await?,
            _ => HashMap::new(),
        };
        Ok((claim.next, with_delivery_counts(entries, &counts)))
    }

    async fn delivery_counts(
        &mut self,
        first: EntryId,
        last: EntryId,
        n: usize,
    ) -> Result<HashMap<EntryId, u32>, RedisError> {
        let mut conn = self.shared.conn.clone();
        let reply: Value = self.cmds.delivery_counts(first, last, n).query_async(&mut conn).await?;
        let rows = stream_reply::pending_rows(&reply).map_err(reply_error)?;
        Ok(rows.into_iter().map(|r| (r.id, r.delivery_count)).collect())
    }

    /// Step 4: new entries. Returns `false` when stopped, `true` after a failed read (claim again first).
    async fn read_new(&mut self) -> bool {
        loop {
            if now().saturating_duration_since(self.last_claim) >= self.shared.reclaim_every {
                // Claim again (entries a late read handed to a dead member); acks go out first so nothing this
                // reader handled is claimed back.
                self.flush_acks().await;
                return true;
            }
            if !self.may_handle() {
                // Not reading on: acknowledge what was handled now rather than with a next read.
                self.flush_acks().await;
            }
            if !self.wait_for_lease().await {
                return false;
            }
            let mut dedicated = match self.dedicated.take() {
                Some(c) => c,
                None => match self.connect_dedicated().await {
                    Ok(c) => c,
                    Err(e) => {
                        if !self.redis_failed("connecting the reader", &e).await {
                            return false;
                        }
                        continue;
                    }
                },
            };
            let result = self.blocking_read(&mut dedicated).await;
            match result {
                Ok(None) => {
                    // Stopped while blocked: closing the connection ends the read on the server.
                    drop(dedicated);
                    return false;
                }
                Ok(Some(entries)) => {
                    self.redis_ok();
                    self.redirects = 0;
                    self.dedicated = Some(dedicated);
                    for entry in entries {
                        // Re-checked after every blocking read and before every entry.
                        if !self.may_handle() {
                            break;
                        }
                        self.handle(entry, 1).await;
                    }
                    // The acknowledgements still queued go out with the next read (see `blocking_read`).
                }
                Err(e) if is_nogroup(&e) => {
                    self.dedicated = Some(dedicated);
                    if !self.ensure_group().await {
                        return false;
                    }
                }
                Err(e) => {
                    drop(dedicated);
                    if let Some(redirect) = Redirect::from_error(&e) {
                        // The shard's slot is served elsewhere (moved, or migrating and the stream already moved):
                        // nothing was read; read there, after claiming again like after any failed read.
                        debug!(shard = %self.shard, ?redirect, "XREADGROUP redirected");
                        self.route.redirected(&self.shared.redis, &redirect).await;
                        self.redirects += 1;
                        if self.redirects == 1 {
                            return true;
                        }
                        return self.redis_failed("XREADGROUP (redirected again)", &e).await;
                    }
                    // The connection may be broken: reconnect after the backoff (to the slot's master by a fresh
                    // slot map), and claim again first.
                    self.route.lost();
                    return self.redis_failed("XREADGROUP", &e).await;
                }
            }
        }
    }

    /// Handles one entry until it is acknowledged, dead-lettered, or left pending because the shard is no longer
    /// ours.
    async fn handle(&mut self, entry: RawEntry, delivery_count: u32) {
        let in_flight = self.in_flight.begin();
        let Some(fields) = entry.fields else {
            // Pending but trimmed from the stream: nothing to hand over; drop it from the pending list.
            self.acknowledge(entry.id, in_flight, now()).await;
            return;
        };
        let mut message = Message {
            stream: Arc::clone(&self.stream),
            shard: self.shard,
            id: entry.id,
            fields: Arc::new(fields),
            delivery_count,
            fencing_token: self.fencing_token,
        };
        let mut retries = Retries::new(self.shared.max_deliveries, self.shared.retry_min, self.shared.retry_max);
        loop {
            if let Some(why) = retries.exhausted(message.delivery_count) {
                self.dead_letter(&message, &why).await;
                return;
            }
            let attempt = AssertUnwindSafe(self.shared.handler.handle(message.clone())).catch_unwind();
            let mut under_lease = UnderLease::new(&self.shared.lease, attempt);
            let outcome = (&mut under_lease).await;
            // The lease was checked (the clock read) just before the poll that finished the handler: when it was
            // handled, for the acknowledgement window, without reading the clock again.
            let handled_at = under_lease.checked_at().unwrap_or_else(now);
            drop(under_lease);
            let result = match outcome {
                Ok(result) => result,
                Err(LeaseExpired) => {
                    // Dropped unfinished: its result would not count, and nothing is acknowledged for it.
                    self.shared.metrics.handler_expired();
                    warn!(shard = %self.shard, id = %message.id, deliveries = message.delivery_count,
                        "assignment lease ran out while the handler ran: handler dropped, entry left pending for \
                         the shard's next owner");
                    return;
                }
            };
            let delay = match retries.decide(message.delivery_count, result) {
                Decision::Acknowledge => {
                    self.shared.metrics.entry_handled();
                    self.acknowledge(message.id, in_flight, handled_at).await;
                    return;
                }
                Decision::DeadLetter(why) => {
                    self.dead_letter(&message, &why).await;
                    return;
                }
                Decision::Exhausted(error) => {
                    self.failed(&message, &error);
                    self.dead_letter(&message, &error).await;
                    return;
                }
                Decision::Retry { delay, error } => {
                    self.failed(&message, &error);
                    delay
                }
            };
            // The entries handled before this one are not held back by its retries.
            self.flush_acks().await;
            if !self.pause(delay).await || !self.may_handle() {
                // Left pending: the shard's next owner (or this member, if it gets the shard back) retries it.
                return;
            }
            match self.record_retry(message.id).await {
                Some(true) => message.delivery_count += 1,
                Some(false) => return, // trimmed meanwhile: nothing left to handle
                None => message.delivery_count += 1,
            }
        }
    }

    /// A failed attempt (not a dead letter the handler asked for): counted and logged.
    fn failed(&self, message: &Message, error: &str) {
        self.shared.metrics.handler_failed();
        warn!(shard = %self.shard, id = %message.id, deliveries = message.delivery_count, error = %error,
            "handler failed");
    }

    /// Counts a retry as a delivery in Redis (`XCLAIM` to this member with min-idle 0 increments the count).
    /// `Some(false)` when the entry is gone or the lease ran out (nothing more to do here); `None` when Redis could
    /// not be asked.
    async fn record_retry(&mut self, id: EntryId) -> Option<bool> {
        if !self.within_lease() {
            return Some(false);
        }
        let mut conn = self.shared.conn.clone();
        let r: Result<Value, RedisError> = self.cmds.count_retry(id).query_async(&mut conn).await;
        match r.map(|v| stream_reply::entries("XCLAIM", v)) {
            Ok(Ok(entries)) => Some(entries.iter().any(|e| e.id == id && e.fields.is_some())),
            Ok(Err(e)) => {
                warn!(shard = %self.shard, error = %e, "XCLAIM");
                None
            }
            Err(e) => {
                debug!(shard = %self.shard, error = %e, "XCLAIM failed; counting the retry locally");
                None
            }
        }
    }

    /// Whether to try a failed acknowledgement (or dead-lettering) again: always while the shard is ours (an
    /// entry left pending under this member would not be delivered again while it keeps the shard), a few more
    /// times once stopped (the next owner re-delivers it anyway).
    async fn retry_after(&mut self, what: &str, e: &RedisError, attempts_after_stop: &mut u32) -> bool {
        if self.stop.is_cancelled() {
            if *attempts_after_stop == 0 {
                return false;
            }
            *attempts_after_stop -= 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            return true;
        }
        self.redis_failed(what, e).await || *attempts_after_stop > 0
    }

    /// Queues an entry handled at `handled_at` for the next batched `XACK` (it stays in flight until then); sends the batch at
    /// once when its oldest entry has waited [`ack_batch::ACK_WINDOW`]. (The queue holds at most one read's or one claim
    /// batch's entries: `batch_size`.)
    async fn acknowledge(&mut self, id: EntryId, in_flight: InFlightGuard, handled_at: Instant) {
        if self.acks.push(id, in_flight, handled_at) {
            self.flush_acks().await;
        }
    }

    /// One `XACK` of every queued entry, retried until it succeeds while the shard is ours; then they are no
    /// longer in flight. A lost ack only means the entries are delivered again (at-least-once).
    async fn flush_acks(&mut self) {
        if self.acks.is_empty() {
            return;
        }
        let mut attempts_after_stop = 3;
        loop {
            if !self.within_lease() {
                debug!(shard = %self.shard, entries = self.acks.len(),
                    "lease ran out: acknowledgements not sent; the entries are delivered again");
                break;
            }
            match self.send_acks().await {
                Ok(()) => {
                    self.redis_ok();
                    break;
                }
                Err(e) => {
                    if !self.retry_after("XACK", &e, &mut attempts_after_stop).await {
                        warn!(shard = %self.shard, entries = self.acks.len(),
                            "entries left unacknowledged; they will be delivered again");
                        break;
                    }
                }
            }
        }
        self.acks.clear();
    }

    /// `XACK <shard> <group> <every queued id>`, once.
    async fn send_acks(&self) -> Result<(), RedisError> {
        let mut conn = self.shared.conn.clone();
        let _acked: i64 = self.cmds.ack(self.acks.ids()).query_async(&mut conn).await?;
        Ok(())
    }

    /// Appends the entry to the shard's dead-letter stream and acknowledges it, atomically.
    async fn dead_letter(&mut self, message: &Message, error: &str) {
        let fields = dead_letter::entry_fields(message, &self.shared.group, &self.shared.member_id, error);
        let mut attempts_after_stop = 3;
        loop {
            if !self.within_lease() {
                warn!(shard = %self.shard, id = %message.id,
                    "lease ran out: entry not dead-lettered; it stays pending for the shard's next owner");
                return;
            }
            let mut conn = self.shared.conn.clone();
            let r: Result<(String,), RedisError> =
                self.cmds.dead_letter(message.id, &fields).query_async(&mut conn).await;
            match r {
                Ok((dead_letter_id,)) => {
                    self.redis_ok();
                    self.shared.metrics.dead_lettered();
                    warn!(shard = %self.shard, id = %message.id, %dead_letter_id, key = %self.cmds.dead_letter_key,
                        "entry dead-lettered");
                    return;
                }
                Err(e) => {
                    if !self.retry_after("dead-lettering", &e, &mut attempts_after_stop).await {
                        warn!(shard = %self.shard, id = %message.id, "entry not dead-lettered; it stays pending");
                        return;
                    }
                }
            }
        }
    }
}
