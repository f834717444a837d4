//! The fenced publish on one server as a checked transaction (issue 17): per lane, the batches waiting (of any of
//! the lane's shards, at most [`MAX_RECORDS_PER_TRANSACTION`] records) are written together in two round trips:
//!
//! 1. `UNWATCH`, `WATCH <their fences>`, `HMGET <fence> routingVersion bornVersion` per fence, `MULTI`; the
//!    producer checks each shard's record against the routing its batch was routed with ([`crate::fence`]);
//! 2. the `XADD`s of every batch its shard takes, then `EXEC` (`DISCARD` when none is left). A batch its shard
//!    refuses (a fence above its version, or, where the routing promises records, a shard not born at it) fails
//!    as [`PublishError::Fenced`], not written.
//!
//! The batches of a call are built (their `XADD` commands encoded) by the calling task and queued in issue order;
//! the first caller to get the lane's turn writes everything queued by then, in queue order, and hands every batch
//! its outcome ("group commit"): fewer round trips, larger pipelines, and no task encodes for the others.
//!
//! # Turns overlap
//! A turn holds the lane from its check until its `XADD`s and `EXEC` are handed to the connection, not until
//! `EXEC` is answered: the next turn's check goes out right behind that `EXEC` (the connection keeps their order,
//! and `EXEC` ends the previous `WATCH`), so Redis always has the lane's next work queued instead of idling for a
//! round trip per turn. Order is kept by one rule: a turn writes only after the previous turn's `EXEC` has an
//! answer. If that `EXEC` was aborted by `WATCH`, the previous turn put its batches back at the front of the queue,
//! and this turn `DISCARD`s and puts its own right behind them; the next turn checks them all again, in order.
//!
//! # Why this is as safe as the publish script
//! * `WATCH` makes `EXEC` answer nil when the fence key was modified after it: a seal (which raises the fence,
//!   `HSET`) between the check and the writes aborts the whole batch, nothing of it written. The check is then
//!   taken again, and reports the new fence.
//! * The `XADD`s leave only after the producer read a fence it accepts and `MULTI` was acknowledged: any failure
//!   of the first round trip (an error reply to any of its commands, a lost connection, a fence that is not a
//!   number) stops the batch before a single `XADD` is sent. Fail closed by construction. (A design that sends
//!   the writes in the same pipeline as a script that *dirties* the watched key when fenced would need no second
//!   round trip, but would write unchecked whenever the script did not run: `NOSCRIPT`, `BUSY`, an ACL without
//!   `EVAL`.)
//! * The lane is held exclusively for both round trips (`Transactions::turn`): `WATCH` and `MULTI` are state of
//!   the connection, and another pipeline on it would run inside our transaction or clear our watch. Both round trips
//!   use the same connection; if the holder is dropped between them (cancellation) or the connection fails, the
//!   connection is discarded, so its state dies with it.
//! * `EXEC` runs the queued `XADD`s with nothing in between, and an error while queueing (out of memory) aborts
//!   the transaction. The `XADD`s of one batch address one key, so a key of the wrong type fails them all. A batch
//!   is written whole or not at all, like a script call.
//! * A batch's outcome is settled by the transaction that carried it; the batches of an `EXEC` aborted by `WATCH`
//!   go back to the front of the queue and are checked and sent again before any later batch of the lane (at most
//!   [`MAX_ATTEMPTS`] times).
//!
//! # Cost
//! Redis spends 11,041 instructions per record on this (`scripts/script-cost.sh`, variant `watch`, 128 records
//! per batch), 0.908 of plain pipelined `XADD`s, against 14,515 (0.691) for the publish script: its per-record
//! Lua work (every argument interned as a Lua string, a `redis.call` per record) is gone. The client pays a
//! second round trip per turn, shared by every batch the turn carries.
//!
//! Used for the fenced producer without idempotence on one server. The idempotent producer keeps the script (its
//! sequence check and the remembered ids must change atomically with the write), and so does a Redis Cluster
//! (a redirect there answers command by command, and a transaction cannot be followed that way).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::fence::{Presented, ShardRecord};
use bytes::Bytes;
use protocol::keys::{self, shard_fence_fields};
use protocol::{RoutingVersion, ShardId};
use redis::{RedisError, RedisResult, Value};
use redis_link::PipelinedConnection;
use tokio::sync::{oneshot, watch};

use super::{reply_of, xadd_outcome, InFlightGuard, Lane, Published, Publisher, Record, Replication};
use crate::error::PublishError;
use crate::publish_script::MAX_RECORDS_PER_CALL;

/// Most records one transaction carries (the batches waiting beyond it go in the next turn): bounds the time one
/// `EXEC` holds Redis and the size of one write.
const MAX_RECORDS_PER_TRANSACTION: usize = 4 * MAX_RECORDS_PER_CALL;

/// Transactions of one batch aborted by a change of a fence that still let it write (the key was touched, not
/// raised above its version). More fails the batch as not written.
const MAX_ATTEMPTS: u32 = 3;

/// The checked transactions of one lane.
#[derive(Default)]
pub(crate) struct Transactions {
    /// Batches waiting to be written, in issue order, and the end of the last turn whose `EXEC` is not answered
    /// yet. A std mutex: held only to push or take.
    queue: Mutex<Queue>,
    /// The turn: its holder checks what is queued and hands its writes to the connection, alone on the lane.
    turn: tokio::sync::Mutex<()>,
    /// Notified when batches are put back in the queue.
    requeued: tokio::sync::Notify,
}

#[derive(Default)]
struct Queue {
    batches: VecDeque<Batch>,
    /// How the last turn that sent `EXEC` ended, for the next turn to wait on (taken by it).
    last: Option<watch::Receiver<Option<TurnEnd>>>,
}

/// The end of the turn before, as a turn took it with its batches. A turn that stops before waiting for it (its
/// check failed, or refused every batch) puts it back for the next turn, unless that turn already ended: its
/// `EXEC` may still be aborted, and the batches it then puts back must be written before anything queued after them.
struct PreviousEnd<'a> {
    lanes: &'a Transactions,
    end: Option<watch::Receiver<Option<TurnEnd>>>,
}

impl PreviousEnd<'_> {
    /// Waits for the previous turn's end (`None`: there is none, or its turn was dropped unanswered).
    async fn wait(&mut self) -> Option<TurnEnd> {
        let mut end = self.end.take()?;
        let ended = end.wait_for(Option::is_some).await.ok().and_then(|e| *e);
        ended
    }
}

impl Drop for PreviousEnd<'_> {
    fn drop(&mut self) {
        let Some(end) = self.end.take() else { return };
        let mut queue = self.lanes.queue();
        // An aborted turn sends its end under this lock, after putting its batches back at the front: ended means
        // those batches are there already (nobody took them: this turn holds the lane), not ended means its own
        // settling will see the end here and deal with it.
        if end.borrow().is_none() && queue.last.is_none() {
            queue.last = Some(end);
        }
    }
}

/// How a turn that sent `EXEC` ended, as the next turn needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TurnEnd {
    /// Its batches are settled (written, refused, or unknown): nothing of it will be sent again.
    Settled,
    /// `WATCH` aborted its `EXEC`: its first `requeued` batches of the queue are to be written first.
    Aborted { requeued: usize },
}

/// One shard batch, encoded by its caller.
struct Batch {
    shard: ShardId,
    fence_key: String,
    presented: Presented,
    /// Its `XADD`s, as RESP (sent again as they are if `WATCH` aborts the transaction).
    writes: Bytes,
    /// How many records (`XADD`s in `writes`).
    records: usize,
    /// Transactions of it aborted by `WATCH` so far.
    aborted: u32,
    outcome: oneshot::Sender<Vec<Result<Published, PublishError>>>,
}

impl Batch {
    fn settle(self, results: Vec<Result<Published, PublishError>>) {
        // The caller may be gone (cancelled): the outcome is then nobody's business.
        let _ = self.outcome.send(results);
    }

    fn fail(self, error: PublishError) {
        let n = self.records;
        self.settle(vec![Err(error); n]);
    }
}

/// Where a batch's caller waits for its records' outcomes.
type BatchOutcome = oneshot::Receiver<Vec<Result<Published, PublishError>>>;

/// Fails every batch with the error `error` makes for its shard.
fn fail_all(batches: Vec<Batch>, error: impl Fn(ShardId) -> PublishError) {
    for b in batches {
        let e = error(b.shard);
        b.fail(e);
    }
}

impl Transactions {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .expect("the transaction queue lock is never held across a panic")
    }

    /// Takes the batches of the next transaction (whole batches in queue order, up to the record bound, at least
    /// one), and the end of the previous turn to wait for before writing them.
    fn take(&self) -> (Vec<Batch>, PreviousEnd<'_>) {
        let mut queue = self.queue();
        let mut taken = Vec::new();
        let mut records = 0;
        while let Some(next) = queue.batches.front() {
            if !taken.is_empty() && records + next.records > MAX_RECORDS_PER_TRANSACTION {
                break;
            }
            records += next.records;
            taken.push(queue.batches.pop_front().expect("front exists"));
        }
        let end = if taken.is_empty() { None } else { queue.last.take() };
        (taken, PreviousEnd { lanes: self, end })
    }

    /// Puts `batches` back at position `at` of the queue, in their order.
    fn requeue(&self, at: usize, batches: Vec<Batch>) {
        {
            let mut queue = self.queue();
            let at = at.min(queue.batches.len());
            for (i, b) in batches.into_iter().enumerate() {
                queue.batches.insert(at + i, b);
            }
        }
        self.requeued.notify_waiters();
    }
}

impl Publisher {
    /// Publishes one shard's records as checked transactions: queued as batches of at most
    /// [`MAX_RECORDS_PER_CALL`] records on the shard's lane, written by whoever holds the lane's turn.
    pub(super) async fn run_transactions(
        &self,
        shard: ShardId,
        records: &[&Record],
        presented: Presented,
        minid: Option<&str>,
    ) -> Vec<Result<Published, PublishError>> {
        let lane = &self.lanes[shard.index() % self.lanes.len()];
        let waiting = self.queue_batches(lane, shard, records, presented, minid);
        let mut out: Vec<Result<Published, PublishError>> = Vec::with_capacity(records.len());
        for (mut rx, n) in waiting {
            let settled = |rx: &mut oneshot::Receiver<_>| match rx.try_recv() {
                Ok(results) => Some(results),
                // The caller whose turn carried it was cancelled mid-way: its writes may have left.
                Err(oneshot::error::TryRecvError::Closed) => Some(vec![Err(PublishError::Abandoned); n]),
                Err(oneshot::error::TryRecvError::Empty) => None,
            };
            let results = loop {
                if let Some(results) = settled(&mut rx) {
                    break results;
                }
                // Armed before the queue is looked at: batches put back after that wake us.
                let requeued = lane.transactions.requeued.notified();
                let mut requeued = std::pin::pin!(requeued);
                requeued.as_mut().enable();
                let turn = lane.transactions.turn.lock().await;
                // Written meanwhile by the turn before ours?
                if let Some(results) = settled(&mut rx) {
                    break results;
                }
                if !self.write_queued(lane, turn).await {
                    // Nothing queued: ours is in a transaction whose EXEC is on its way. Wait for its outcome, or
                    // for it to come back to the queue (an EXEC aborted by WATCH).
                    tokio::select! {
                        outcome = &mut rx => break outcome.unwrap_or_else(|_| vec![Err(PublishError::Abandoned); n]),
                        () = requeued => {}
                    }
                }
            };
            debug_assert_eq!(results.len(), n);
            out.extend(results);
        }
        self.count(&out);
        out
    }

    /// Encodes one shard's records as batches of at most [`MAX_RECORDS_PER_CALL`] and queues them on `lane`,
    /// together and in order; returns each batch's outcome receiver and size.
    fn queue_batches(
        &self,
        lane: &Lane,
        shard: ShardId,
        records: &[&Record],
        presented: Presented,
        minid: Option<&str>,
    ) -> Vec<(BatchOutcome, usize)> {
        let stream_key = keys::shard_stream(&self.stream, shard);
        let fence_key = keys::shard_fence(&self.stream, shard);
        // Encoded here, by the caller, before the queue's lock is taken.
        let batches: Vec<(Bytes, usize)> = records
            .chunks(MAX_RECORDS_PER_CALL)
            .map(|chunk| {
                (
                    self.encode_xadds(&stream_key, chunk.iter().copied(), minid),
                    chunk.len(),
                )
            })
            .collect();
        let mut waiting = Vec::with_capacity(batches.len());
        // One push for all batches of the call: they stay together and in order.
        let mut queue = lane.transactions.queue();
        for (writes, n) in batches {
            let (outcome, rx) = oneshot::channel();
            queue.batches.push_back(Batch {
                shard,
                fence_key: fence_key.clone(),
                presented,
                writes,
                records: n,
                aborted: 0,
                outcome,
            });
            waiting.push((rx, n));
        }
        waiting
    }

    /// One turn: checks the batches queued now (up to the bound), hands their writes to the connection as one
    /// checked transaction, lets the next turn go (`turn` is released), and settles each batch from `EXEC`'s
    /// answer. The caller holds the lane's turn. `false`: nothing was queued.
    async fn write_queued(&self, lane: &Lane, turn: tokio::sync::MutexGuard<'_, ()>) -> bool {
        let (batches, previous) = lane.transactions.take();
        if batches.is_empty() {
            return false;
        }
        let (generation, mut con) = match lane.connection().await {
            Ok(c) => c,
            Err(f) => {
                fail_all(batches, |shard| f.clone().into_publish_error(shard));
                return true;
            }
        };
        // The distinct fences, each read once.
        let mut fences: Vec<&str> = Vec::new();
        for b in &batches {
            if !fences.contains(&b.fence_key.as_str()) {
                fences.push(&b.fence_key);
            }
        }
        let mut check = redis::pipe();
        check.ignore_errors();
        check.cmd("UNWATCH").cmd("WATCH");
        for f in &fences {
            check.arg(*f);
        }
        for f in &fences {
            check
                .cmd("HMGET")
                .arg(*f)
                .arg(shard_fence_fields::ROUTING_VERSION)
                .arg(shard_fence_fields::BORN_VERSION)
                .arg(shard_fence_fields::FENCE_COUNT)
                .arg(shard_fence_fields::BORN_COUNT);
        }
        check.cmd("MULTI");
        let fences: Vec<String> = fences.into_iter().map(str::to_owned).collect();
        let mut conn = TurnConnection {
            lane,
            generation,
            con: &mut con,
            open_transaction: false,
        };
        self.stats.pipelines.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlightGuard::enter(&self.stats.pipelines_in_flight);
        // From here until EXEC or DISCARD is handed over the connection may be inside MULTI.
        conn.open_transaction = true;
        let replies = match conn.run(&check).await {
            Ok(r) => r,
            Err(e) => {
                let source = Arc::new(e);
                fail_all(batches, |shard| PublishError::NotSent {
                    shard,
                    source: source.clone(),
                });
                return true;
            }
        };
        let read = match check_reply(replies, fences.len()) {
            Ok(read) => read,
            Err(e) => {
                // Whether MULTI was taken or not, nothing more goes on this connection.
                conn.drop_connection();
                let source = Arc::new(e);
                fail_all(batches, |shard| PublishError::Rejected {
                    shard,
                    source: source.clone(),
                });
                return true;
            }
        };
        // Nothing is written before the previous turn's EXEC has its answer (it went out before our check, so it
        // is here or about to be). Aborted, its batches are back at the front: ours go right behind them.
        let mut previous = previous;
        if let Some(TurnEnd::Aborted { requeued }) = previous.wait().await {
            conn.discard_transaction().await;
            lane.transactions.requeue(requeued, batches);
            return true;
        }
        // Settle the batches the check refuses; keep the others, in order.
        let mut kept = Vec::with_capacity(batches.len());
        for b in batches {
            let at = fences
                .iter()
                .position(|f| *f == b.fence_key)
                .expect("every fence was read");
            match &read[at] {
                Fence::Unreadable(e) => {
                    let shard = b.shard;
                    b.fail(PublishError::Rejected {
                        shard,
                        source: Arc::new(e.clone()),
                    });
                }
                Fence::Read(record) => match b.presented.refusal(*record) {
                    Some(fence) => {
                        let (shard, routing_version) = (b.shard, b.presented.version);
                        b.fail(PublishError::Fenced {
                            shard,
                            routing_version,
                            fence,
                        });
                    }
                    None => kept.push(b),
                },
            }
        }
        let batches = kept;
        if batches.is_empty() {
            conn.discard_transaction().await;
            return true;
        }
        let count: usize = batches.iter().map(|b| b.records).sum();
        let mut writes: Vec<Bytes> = batches.iter().map(|b| b.writes.clone()).collect();
        writes.push(Bytes::from_static(EXEC));
        // Durable: WAIT right behind EXEC, in the same write (`durable.rs`).
        let waits = self.wait_behind(&mut writes);
        let answer = conn.con.submit(writes, count + 1 + waits);
        // EXEC is on the wire: whatever happens to this future now, the connection leaves the transaction.
        conn.open_transaction = false;
        let (ended, end) = watch::channel(None);
        lane.transactions.queue().last = Some(end.clone());
        // The next turn may check now; it writes only after `ended` says how this one ended.
        drop(turn);
        let mut replies = match answer.await {
            Ok(replies) => replies.into_iter().map(reply_of).collect::<Vec<_>>(),
            Err(e) => {
                lane.discard(generation);
                let source = Arc::new(e);
                fail_all(batches, |shard| PublishError::ConnectionLost {
                    shard,
                    source: source.clone(),
                });
                let _ = ended.send(Some(TurnEnd::Settled));
                return true;
            }
        };
        let replication = self.wait_reply(&mut replies, waits);
        settle_exec(lane, &ended, &end, batches, replies, count, &replication);
        true
    }
}

/// Settles the batches of a transaction from the replies to its `count` queued `XADD`s and `EXEC`, and sends how
/// the turn ended on `ended`. The batches of an `EXEC` aborted by `WATCH` go back to the front of the queue, to be checked
/// again before anything queued after them (up to [`MAX_ATTEMPTS`] transactions each); `end` is the turn's own end,
/// dropped from the queue if no later turn took it (nobody waits for it then). The records `EXEC` wrote are Written
/// only as far as `replication` (the durable producer's `WAIT`) confirms them.
fn settle_exec(
    lane: &Lane,
    ended: &watch::Sender<Option<TurnEnd>>,
    end: &watch::Receiver<Option<TurnEnd>>,
    batches: Vec<Batch>,
    mut replies: Vec<RedisResult<Value>>,
    count: usize,
    replication: &Replication,
) {
    let settled = || {
        let _ = ended.send(Some(TurnEnd::Settled));
    };
    if replies.len() != count + 1 {
        let detail = format!("{} replies to {count} queued XADDs and EXEC", replies.len());
        fail_all(batches, |shard| PublishError::UnexpectedReply {
            shard,
            detail: detail.clone(),
        });
        settled();
        return;
    }
    match replies.pop().expect("checked the length") {
        // A fence was touched after WATCH: nothing written.
        Ok(Value::Nil) => {
            let (again, spent): (Vec<Batch>, Vec<Batch>) =
                batches.into_iter().partition(|b| b.aborted + 1 < MAX_ATTEMPTS);
            let source = Arc::new(RedisError::from((
                redis::ErrorKind::Client,
                "a fence changed during every attempt",
                format!("{MAX_ATTEMPTS} transactions aborted by WATCH"),
            )));
            fail_all(spent, |shard| PublishError::Rejected {
                shard,
                source: source.clone(),
            });
            let requeued = again.len();
            let mut queue = lane.transactions.queue();
            for (i, mut b) in again.into_iter().enumerate() {
                b.aborted += 1;
                queue.batches.insert(i, b);
            }
            if queue.last.as_ref().is_some_and(|last| last.same_channel(end)) {
                queue.last = None;
            }
            // Under the queue's lock: see `PreviousEnd`'s drop.
            let _ = ended.send(Some(TurnEnd::Aborted { requeued }));
            drop(queue);
            lane.transactions.requeued.notify_waiters();
            return;
        }
        Ok(Value::Array(items)) if items.len() == count => {
            let mut items = items.into_iter();
            for b in batches {
                let (shard, version) = (b.shard, b.presented.version);
                let results = items
                    .by_ref()
                    .take(b.records)
                    .map(|item| xadd_outcome(shard, version, Ok(item)))
                    .collect();
                b.settle(replication.apply(results));
            }
        }
        Ok(other) => {
            let detail = format!("EXEC answered {other:?}");
            fail_all(batches, |shard| PublishError::UnexpectedReply {
                shard,
                detail: detail.clone(),
            });
        }
        // EXECABORT (an XADD was refused while queued, e.g. out of memory) or EXEC itself refused: the first queued
        // refusal says why.
        Err(exec_error) => {
            let source = Arc::new(replies.into_iter().find_map(Result::err).unwrap_or(exec_error));
            fail_all(batches, |shard| PublishError::Rejected {
                shard,
                source: source.clone(),
            });
        }
    }
    settled();
}

/// The lane's connection during a turn. If the turn ends (or its future is dropped) while the connection may be
/// inside `MULTI`, the connection is discarded, and its state dies with it.
struct TurnConnection<'a> {
    lane: &'a Lane,
    generation: u64,
    con: &'a mut PipelinedConnection,
    open_transaction: bool,
}

/// `EXEC` as RESP.
const EXEC: &[u8] = b"*1\r\n$4\r\nEXEC\r\n";

impl TurnConnection<'_> {
    /// Runs a pipeline whose replies may individually be errors; a transport error discards the connection.
    async fn run(&mut self, pipe: &redis::Pipeline) -> Result<Vec<RedisResult<Value>>, RedisError> {
        let replies = self.lane.query(self.generation, self.con, pipe).await;
        if replies.is_err() {
            self.open_transaction = false;
        }
        replies
    }

    fn drop_connection(&mut self) {
        self.lane.discard(self.generation);
        self.open_transaction = false;
    }

    /// Leaves the transaction opened by a check: `DISCARD`, or the connection goes.
    async fn discard_transaction(&mut self) {
        let mut pipe = redis::pipe();
        pipe.cmd("DISCARD");
        match self.run(&pipe).await {
            Ok(r) if matches!(r.first(), Some(Ok(_))) => self.open_transaction = false,
            _ => self.drop_connection(),
        }
    }
}

impl Drop for TurnConnection<'_> {
    fn drop(&mut self) {
        if self.open_transaction {
            self.lane.discard(self.generation);
        }
    }
}

/// A fence as the check read it.
#[derive(Debug)]
enum Fence {
    /// The shard's record: its fence (0 when absent), birth (`None`: no record) and their layouts' counts.
    Read(ShardRecord),
    /// The fence holds something that is not a routing version: refused, fail closed.
    Unreadable(RedisError),
}

/// Reads the replies of `UNWATCH`, `WATCH`, `HMGET` x `fences`, `MULTI`. `Err`: a command was refused or the
/// replies do not fit (the transaction must not go on, on this connection).
fn check_reply(replies: Vec<RedisResult<Value>>, fences: usize) -> Result<Vec<Fence>, RedisError> {
    let unexpected = |detail: String| RedisError::from((redis::ErrorKind::UnexpectedReturnType, "fence check", detail));
    if replies.len() != fences + 3 {
        return Err(unexpected(format!(
            "{} replies to {} commands",
            replies.len(),
            fences + 3
        )));
    }
    let mut replies = replies.into_iter();
    let mut next = || replies.next().expect("length checked");
    next()?; // UNWATCH
    next()?; // WATCH
    let values: Vec<RedisResult<Value>> = (0..fences).map(|_| next()).collect();
    next()?; // MULTI
    values.into_iter().map(|v| read_fence(v?)).collect()
}

/// One `HMGET <fence> routingVersion bornVersion fenceCount bornCount` answer. A field that holds something other
/// than a version (or a count) is [`Fence::Unreadable`]: refused, fail closed.
fn read_fence(v: Value) -> Result<Fence, RedisError> {
    let unexpected = |detail: String| RedisError::from((redis::ErrorKind::UnexpectedReturnType, "fence check", detail));
    let Value::Array(fields) = v else {
        return Err(unexpected(format!("HMGET answered {v:?}")));
    };
    let [fence, born, fence_count, born_count] =
        <[Value; 4]>::try_from(fields).map_err(|f| unexpected(format!("HMGET answered {f:?}")))?;
    let field = |v: Value| -> Result<Result<Option<RoutingVersion>, RedisError>, RedisError> {
        match v {
            Value::Nil => Ok(Ok(None)),
            Value::BulkString(bytes) => Ok(parse_fence(&bytes).map(Some).ok_or_else(|| {
                RedisError::from((
                    redis::ErrorKind::Parse,
                    "CORRUPT fence",
                    format!("holds {:?}", String::from_utf8_lossy(&bytes[..bytes.len().min(40)])),
                ))
            })),
            other => Err(unexpected(format!("HMGET answered {other:?}"))),
        }
    };
    // A count is a version's digits that fit a shard count.
    let count = |v: Value| -> Result<Result<u32, RedisError>, RedisError> {
        Ok(field(v)?.and_then(|c| {
            c.map_or(Ok(0), |c| {
                u32::try_from(c.0).map_err(|_| RedisError::from((redis::ErrorKind::Parse, "CORRUPT fence count")))
            })
        }))
    };
    Ok(
        match (field(fence)?, field(born)?, count(fence_count)?, count(born_count)?) {
            (Ok(fence), Ok(born), Ok(fence_count), Ok(born_count)) => Fence::Read(ShardRecord {
                fence: fence.unwrap_or(RoutingVersion(0)),
                fence_count,
                born,
                born_count,
            }),
            (Err(e), ..) | (_, Err(e), ..) | (.., Err(e), _) | (.., Err(e)) => Fence::Unreadable(e),
        },
    )
}

/// A fence value as the coordinator's seal writes it: decimal digits, at most 15 (the seal script's own bound).
fn parse_fence(bytes: &[u8]) -> Option<RoutingVersion> {
    if bytes.is_empty() || bytes.len() > 15 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok().map(RoutingVersion)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: Presented = Presented {
        version: RoutingVersion(1),
        records: false,
        count: 1,
    };

    fn ok(v: Value) -> RedisResult<Value> {
        Ok(v)
    }

    fn hmget(fence: Option<&[u8]>, born: Option<&[u8]>) -> RedisResult<Value> {
        let field = |f: Option<&[u8]>| f.map_or(Value::Nil, |b| Value::BulkString(b.to_vec()));
        ok(Value::Array(vec![field(fence), field(born), Value::Nil, Value::Nil]))
    }

    fn status() -> RedisResult<Value> {
        ok(Value::Okay)
    }

    /// Calls of `command` so far (`INFO commandstats`).
    async fn calls(redis: &test_support::RedisServer, command: &str) -> u64 {
        let stats = redis.info("commandstats").await;
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }

    /// A publisher of stream `orders` with one lane to `redis`.
    fn one_lane(redis: &test_support::RedisServer) -> Publisher {
        Publisher::new(
            protocol::names::StreamName::new("orders").unwrap(),
            redis.client(),
            &redis.url(),
            1,
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(5),
            None,
            Arc::default(),
        )
    }

    fn records(tag: &str) -> Vec<Record> {
        (0..3)
            .map(|i| Record::with_key("k").field("n", format!("{tag}{i}")))
            .collect()
    }

    /// A turn that checked its batches while the previous turn's `EXEC` was still unanswered, and then learns that
    /// `EXEC` was aborted by `WATCH` (its batches back at the front of the queue), writes nothing: it `DISCARD`s
    /// and puts its batches right behind the aborted ones, and the next turn writes both in issue order.
    #[tokio::test]
    async fn a_turn_behind_an_aborted_exec_discards_and_goes_behind_its_batches() {
        let redis = test_support::RedisServer::start().await;
        let p = one_lane(&redis);
        let lane = &p.lanes[0];
        let (a, b) = (records("a"), records("b"));
        let (a, b): (Vec<&Record>, Vec<&Record>) = (a.iter().collect(), b.iter().collect());
        let version = Presented {
            version: RoutingVersion(1),
            records: false,
            count: 1,
        };
        let mut b_out = p.queue_batches(lane, ShardId(0), &b, version, None);
        // The previous turn, which carried `a`, has sent its EXEC; its end is not known yet.
        let (ended, end) = watch::channel(None);
        lane.transactions.queue().last = Some(end);
        let mut a_out = p.queue_batches(lane, ShardId(0), &a, version, None);
        let a_batch = lane.transactions.queue().batches.pop_back().unwrap();
        let turn = lane.transactions.turn.lock().await;
        let b_turn = p.write_queued(lane, turn);
        let previous_aborts = async {
            test_support::wait_until(std::time::Duration::from_secs(5), "b's check ran", || async {
                calls(&redis, "multi").await == 1
            })
            .await;
            // What the previous turn does on a nil EXEC: its batch back at the front, then its end.
            lane.transactions.requeue(0, vec![a_batch]);
            ended.send(Some(TurnEnd::Aborted { requeued: 1 })).unwrap();
        };
        let (wrote, ()) = tokio::join!(b_turn, previous_aborts);
        assert!(wrote);
        assert_eq!(calls(&redis, "discard").await, 1, "b's transaction was left");
        assert_eq!(calls(&redis, "exec").await, 0, "nothing was written");
        let queued: Vec<Bytes> = lane
            .transactions
            .queue()
            .batches
            .iter()
            .map(|b| b.writes.clone())
            .collect();
        assert_eq!(queued.len(), 2);
        assert!(queued[0].windows(2).any(|w| w == b"a0") && queued[1].windows(2).any(|w| w == b"b0"));
        assert!(
            b_out[0].0.try_recv().is_err() && a_out[0].0.try_recv().is_err(),
            "neither settled yet"
        );
        // The next turn takes both, in order, as one transaction.
        assert!(p.write_queued(lane, lane.transactions.turn.lock().await).await);
        for out in [&mut a_out, &mut b_out] {
            let results = out.pop().unwrap().0.await.unwrap();
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
        let mut con = redis.connection().await;
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(protocol::keys::shard_stream(&p.stream, ShardId(0)))
            .arg("-")
            .arg("+")
            .query_async(&mut con)
            .await
            .unwrap();
        let order: Vec<&str> = entries.iter().map(|(_, f)| f[0].1.as_str()).collect();
        assert_eq!(order, ["a0", "a1", "a2", "b0", "b1", "b2"]);
    }

    /// A turn whose check fails (here `HGET` of a fence that is not a hash) stops before waiting for the previous
    /// turn's end: it puts that end back, so the next turn still writes only after it (the previous `EXEC` may yet
    /// be aborted).
    #[tokio::test]
    async fn a_turn_whose_check_fails_leaves_the_previous_end_to_the_next_turn() {
        let redis = test_support::RedisServer::start().await;
        let p = one_lane(&redis);
        let lane = &p.lanes[0];
        let mut con = redis.connection().await;
        let () = redis::cmd("SET")
            .arg(protocol::keys::shard_fence(&p.stream, ShardId(0)))
            .arg("not a hash")
            .query_async(&mut con)
            .await
            .unwrap();
        let b = records("b");
        let b: Vec<&Record> = b.iter().collect();
        let mut b_out = p.queue_batches(lane, ShardId(0), &b, V1, None);
        let (ended, end) = watch::channel(None);
        lane.transactions.queue().last = Some(end.clone());
        assert!(p.write_queued(lane, lane.transactions.turn.lock().await).await);
        let results = b_out.pop().unwrap().0.await.unwrap();
        assert!(
            results.iter().all(|r| matches!(r, Err(PublishError::Rejected { .. }))),
            "{results:?}"
        );
        let restored = lane.transactions.queue().last.take();
        assert!(
            restored.is_some_and(|last| last.same_channel(&end)),
            "the previous end is back"
        );
        // Had the previous turn ended (aborted: its batches back at the front), there is nothing to put back.
        lane.transactions.queue().last = Some(end.clone());
        let (c, _) = (records("c"), ());
        let c: Vec<&Record> = c.iter().collect();
        let mut c_out = p.queue_batches(lane, ShardId(0), &c, V1, None);
        let turn = lane.transactions.turn.lock().await;
        let (batches, previous) = lane.transactions.take();
        ended.send(Some(TurnEnd::Settled)).unwrap();
        drop(previous);
        drop(turn);
        assert!(lane.transactions.queue().last.is_none());
        drop(batches);
        assert!(c_out.pop().unwrap().0.await.is_err(), "dropped unsettled");
    }

    #[test]
    fn exec_is_the_command_redis_rs_packs() {
        assert_eq!(EXEC, redis::cmd("EXEC").get_packed_command());
    }

    #[test]
    fn fence_values_are_decimal_digits_only() {
        assert_eq!(parse_fence(b"0"), Some(RoutingVersion(0)));
        assert_eq!(parse_fence(b"42"), Some(RoutingVersion(42)));
        assert_eq!(
            parse_fence(b"999999999999999"),
            Some(RoutingVersion(999_999_999_999_999))
        );
        for bad in [&b""[..], b"-1", b"1.5", b" 1", b"1e3", b"abc", b"1000000000000000"] {
            assert_eq!(parse_fence(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_check_reads_an_absent_fence_as_zero_and_a_set_one_as_its_value() {
        let read = check_reply(
            vec![
                status(),
                status(),
                hmget(None, None),
                hmget(Some(b"7"), Some(b"3")),
                hmget(Some(b"x"), None),
                hmget(Some(b"7"), Some(b"-")),
                status(),
            ],
            4,
        )
        .unwrap();
        assert!(matches!(read[0], Fence::Read(r) if r == ShardRecord::default()));
        assert!(matches!(
            read[1],
            Fence::Read(ShardRecord {
                fence: RoutingVersion(7),
                born: Some(RoutingVersion(3)),
                fence_count: 0,
                born_count: 0,
            })
        ));
        assert!(matches!(read[2], Fence::Unreadable(_)));
        assert!(matches!(read[3], Fence::Unreadable(_)), "a birth that is not a version");
    }

    #[test]
    fn the_layout_counts_are_read_and_one_that_is_not_a_count_is_refused() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let read = read_fence(Value::Array(vec![bulk("7"), bulk("3"), bulk("8"), bulk("4")])).unwrap();
        assert!(matches!(
            read,
            Fence::Read(ShardRecord {
                fence: RoutingVersion(7),
                born: Some(RoutingVersion(3)),
                fence_count: 8,
                born_count: 4,
            })
        ));
        for bad in ["x", "-1", "4294967296"] {
            let read = read_fence(Value::Array(vec![bulk("7"), bulk("3"), bulk("8"), bulk(bad)])).unwrap();
            assert!(matches!(read, Fence::Unreadable(_)), "{bad}");
            let read = read_fence(Value::Array(vec![bulk("7"), bulk("3"), bulk(bad), Value::Nil])).unwrap();
            assert!(matches!(read, Fence::Unreadable(_)), "{bad}");
        }
    }

    #[test]
    fn any_refused_command_of_the_check_stops_the_batch() {
        let refused = || -> RedisResult<Value> { Err(RedisError::from((redis::ErrorKind::Client, "refused"))) };
        let seven = || hmget(Some(b"7"), None);
        for replies in [
            vec![refused(), status(), seven(), status()],
            vec![status(), refused(), seven(), status()],
            vec![status(), status(), refused(), status()],
            vec![status(), status(), seven(), refused()],
            vec![status(), status(), seven()],
            vec![status(), status(), ok(Value::Int(7)), status()],
            vec![status(), status(), ok(Value::Array(vec![Value::Nil])), status()],
        ] {
            assert!(check_reply(replies, 1).is_err());
        }
    }
}
