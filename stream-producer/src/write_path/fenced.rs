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

use bytes::Bytes;
use client_core::RedisFailure;
use protocol::keys::{self, shard_fence_fields};
use protocol::names::StreamName;
use protocol::{RoutingVersion, ShardId};
use redis::{RedisError, RedisResult, Value};
use redis_link::PipelinedConnection;
use tokio::sync::{oneshot, watch};

use super::batch::ShardBatch;
use super::xadd::xadd_outcome;
use crate::config::ProducerConfig;
use crate::error::PublishError;
use crate::fence::{Presented, ShardRecord};
use crate::lanes::{reply_of, InFlightGuard, Lane, Replication, ServerLanes};
use crate::publish_script::MAX_RECORDS_PER_CALL;
use crate::published::Published;

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

/// The fenced path on one server: every shard batch written as a checked transaction on the shard's lane.
pub(crate) struct Fenced {
    stream: StreamName,
    lanes: ServerLanes,
    /// The checked transactions of each lane (same index): the batches waiting, and the turn of the one caller
    /// that writes all of them while the connection carries nothing else.
    transactions: Vec<Transactions>,
}

impl Fenced {
    pub(crate) fn new(config: &ProducerConfig, lanes: ServerLanes) -> Self {
        let transactions = (0..lanes.len()).map(|_| Transactions::default()).collect();
        Fenced {
            stream: config.stream.clone(),
            lanes,
            transactions,
        }
    }

    /// The lanes it writes on.
    pub(crate) fn lanes(&self) -> &ServerLanes {
        &self.lanes
    }

    /// Publishes one shard's records as checked transactions: queued as batches of at most
    /// [`MAX_RECORDS_PER_CALL`] records on the shard's lane, written by whoever holds the lane's turn.
    pub(crate) async fn write(&self, batch: &ShardBatch<'_>) -> Vec<Result<Published, PublishError>> {
        let at = self.lanes.index_of(batch.shard);
        let transactions = &self.transactions[at];
        let waiting = self.queue_batches(at, batch);
        let mut out: Vec<Result<Published, PublishError>> = Vec::with_capacity(batch.records.len());
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
                let requeued = transactions.requeued.notified();
                let mut requeued = std::pin::pin!(requeued);
                requeued.as_mut().enable();
                let turn = transactions.turn.lock().await;
                // Written meanwhile by the turn before ours?
                if let Some(results) = settled(&mut rx) {
                    break results;
                }
                if !self.write_queued(at, turn).await {
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
        out
    }

    /// Encodes one shard's records as batches of at most [`MAX_RECORDS_PER_CALL`] and queues them on lane `at`,
    /// together and in order; returns each batch's outcome receiver and size.
    fn queue_batches(&self, at: usize, batch: &ShardBatch<'_>) -> Vec<(BatchOutcome, usize)> {
        let stream_key = keys::shard_stream(&self.stream, batch.shard);
        let fence_key = keys::shard_fence(&self.stream, batch.shard);
        // Encoded here, by the caller, before the queue's lock is taken.
        let batches: Vec<(Bytes, usize)> = batch
            .records
            .chunks(MAX_RECORDS_PER_CALL)
            .map(|chunk| (batch.xadd.encode(&stream_key, chunk.iter().copied()), chunk.len()))
            .collect();
        let mut waiting = Vec::with_capacity(batches.len());
        // One push for all batches of the call: they stay together and in order.
        let mut queue = self.transactions[at].queue();
        for (writes, n) in batches {
            let (outcome, rx) = oneshot::channel();
            queue.batches.push_back(Batch {
                shard: batch.shard,
                fence_key: fence_key.clone(),
                presented: batch.presented,
                writes,
                records: n,
                aborted: 0,
                outcome,
            });
            waiting.push((rx, n));
        }
        waiting
    }

    /// One turn on lane `at`: checks the batches queued now (up to the bound), hands their writes to the
    /// connection as one checked transaction, lets the next turn go (`turn` is released), and settles each batch
    /// from `EXEC`'s answer. The caller holds the lane's turn. `false`: nothing was queued.
    async fn write_queued(&self, at: usize, turn: tokio::sync::MutexGuard<'_, ()>) -> bool {
        let (lane, transactions) = (self.lanes.lane(at), &self.transactions[at]);
        let (batches, previous) = transactions.take();
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
        let mut fences: Vec<String> = Vec::new();
        for b in &batches {
            if !fences.contains(&b.fence_key) {
                fences.push(b.fence_key.clone());
            }
        }
        let mut conn = TurnConnection {
            lane,
            generation,
            con: &mut con,
            open_transaction: false,
        };
        let stats = self.lanes.stats();
        stats.pipelines.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlightGuard::enter(&stats.pipelines_in_flight);
        let read = match conn.check(&fences).await {
            Ok(read) => read,
            Err(stopped) => {
                stopped.fail(batches);
                return true;
            }
        };
        // Nothing is written before the previous turn's EXEC has its answer (it went out before our check, so it
        // is here or about to be). Aborted, its batches are back at the front: ours go right behind them.
        let mut previous = previous;
        if let Some(TurnEnd::Aborted { requeued }) = previous.wait().await {
            conn.discard_transaction().await;
            transactions.requeue(requeued, batches);
            return true;
        }
        let batches = refuse_fenced(batches, &fences, &read);
        if batches.is_empty() {
            conn.discard_transaction().await;
            return true;
        }
        self.write_checked(at, conn, turn, batches).await;
        true
    }

    /// The second round trip of a turn: hands the checked batches' `XADD`s and `EXEC` to the turn's connection,
    /// lets the next turn go (`turn` is released), and settles each batch from `EXEC`'s answer.
    async fn write_checked(
        &self,
        at: usize,
        mut conn: TurnConnection<'_>,
        turn: tokio::sync::MutexGuard<'_, ()>,
        batches: Vec<Batch>,
    ) {
        let transactions = &self.transactions[at];
        let count: usize = batches.iter().map(|b| b.records).sum();
        let mut writes: Vec<Bytes> = batches.iter().map(|b| b.writes.clone()).collect();
        writes.push(Bytes::from_static(EXEC));
        // Durable: WAIT right behind EXEC, in the same write (`lanes/durable.rs`).
        let waits = self.lanes.wait_behind(&mut writes);
        let answer = conn.con.submit(writes, count + 1 + waits);
        // EXEC is on the wire: whatever happens to this future now, the connection leaves the transaction.
        conn.open_transaction = false;
        let (ended, end) = watch::channel(None);
        transactions.queue().last = Some(end.clone());
        // The next turn may check now; it writes only after `ended` says how this one ended.
        drop(turn);
        let mut replies = match answer.await {
            Ok(replies) => replies.into_iter().map(reply_of).collect::<Vec<_>>(),
            Err(e) => {
                conn.lane.discard(conn.generation);
                let source = Arc::new(e);
                fail_all(batches, |shard| PublishError::ConnectionLost {
                    shard,
                    source: RedisFailure::from_redis_arc(source.clone()),
                });
                let _ = ended.send(Some(TurnEnd::Settled));
                return;
            }
        };
        let replication = self.lanes.wait_reply(&mut replies, waits);
        settle_exec(transactions, &ended, &end, batches, replies, count, &replication);
    }
}

/// Settles the batches the check refuses (a fence above their version, or one that could not be read) and keeps
/// the others, in order.
fn refuse_fenced(batches: Vec<Batch>, fences: &[String], read: &[Fence]) -> Vec<Batch> {
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
                    source: RedisFailure::from_redis_arc(Arc::new(e.clone())),
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
    kept
}

/// Why a turn's check stopped its batches before anything of them was written.
enum CheckStopped {
    /// The check was not answered (the connection failed): not sent, as far as the writes go.
    NotSent(Arc<RedisError>),
    /// A command of the check was refused, or its replies do not fit.
    Rejected(Arc<RedisError>),
}

impl CheckStopped {
    fn fail(self, batches: Vec<Batch>) {
        match self {
            CheckStopped::NotSent(source) => fail_all(batches, |shard| PublishError::NotSent {
                shard,
                source: RedisFailure::from_redis_arc(source.clone()),
            }),
            CheckStopped::Rejected(source) => fail_all(batches, |shard| PublishError::Rejected {
                shard,
                source: RedisFailure::from_redis_arc(source.clone()),
            }),
        }
    }
}

/// Settles the batches of a transaction from the replies to its `count` queued `XADD`s and `EXEC`, and sends how
/// the turn ended on `ended`. The batches of an `EXEC` aborted by `WATCH` go back to the front of the queue, to be checked
/// again before anything queued after them (up to [`MAX_ATTEMPTS`] transactions each); `end` is the turn's own end,
/// dropped from the queue if no later turn took it (nobody waits for it then). The records `EXEC` wrote are Written
/// only as far as `replication` (the durable producer's `WAIT`) confirms them.
fn settle_exec(
    transactions: &Transactions,
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
            requeue_aborted(transactions, ended, end, batches);
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
                source: RedisFailure::from_redis_arc(source.clone()),
            });
        }
    }
    settled();
}

/// The batches of an `EXEC` aborted by `WATCH` go back to the front of the queue (those with attempts left; the
/// others fail as not written), and the turn's end says so.
fn requeue_aborted(
    transactions: &Transactions,
    ended: &watch::Sender<Option<TurnEnd>>,
    end: &watch::Receiver<Option<TurnEnd>>,
    batches: Vec<Batch>,
) {
    let (again, spent): (Vec<Batch>, Vec<Batch>) = batches.into_iter().partition(|b| b.aborted + 1 < MAX_ATTEMPTS);
    let source = Arc::new(RedisError::from((
        redis::ErrorKind::Client,
        "a fence changed during every attempt",
        format!("{MAX_ATTEMPTS} transactions aborted by WATCH"),
    )));
    fail_all(spent, |shard| PublishError::Rejected {
        shard,
        source: RedisFailure::from_redis_arc(source.clone()),
    });
    let requeued = again.len();
    let mut queue = transactions.queue();
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
    transactions.requeued.notify_waiters();
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

    /// The first round trip of a turn: `UNWATCH`, `WATCH <fences>`, `HMGET` of each fence, `MULTI`; what each
    /// fence holds. From here until `EXEC` or `DISCARD` is handed over the connection may be inside `MULTI`.
    async fn check(&mut self, fences: &[String]) -> Result<Vec<Fence>, CheckStopped> {
        let mut check = redis::pipe();
        check.ignore_errors();
        check.cmd("UNWATCH").cmd("WATCH");
        for f in fences {
            check.arg(f.as_str());
        }
        for f in fences {
            check
                .cmd("HMGET")
                .arg(f.as_str())
                .arg(shard_fence_fields::ROUTING_VERSION)
                .arg(shard_fence_fields::BORN_VERSION)
                .arg(shard_fence_fields::FENCE_COUNT)
                .arg(shard_fence_fields::BORN_COUNT);
        }
        check.cmd("MULTI");
        self.open_transaction = true;
        let replies = self.run(&check).await.map_err(|e| CheckStopped::NotSent(Arc::new(e)))?;
        check_reply(replies, fences.len()).map_err(|e| {
            // Whether MULTI was taken or not, nothing more goes on this connection.
            self.drop_connection();
            CheckStopped::Rejected(Arc::new(e))
        })
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
mod tests;
